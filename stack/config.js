'use strict';

// Derived and validated settings for serverless.yml.
//
// serverless.yml reads every numeric setting through this file
// (`${file(stack/config.js):name}`) so that:
//   - values given on the command line (`--param="launcherTimeout=300"`, always strings) become
//     integers where CloudFormation and the Lambda schema want integers;
//   - the queue visibility timeout is computed from the launcher timeout instead of being a second
//     knob that can be set wrong;
//   - the timeout ordering the launcher relies on is checked before anything is packaged:
//       launcher timeout < queue visibility timeout < claim timeout.
// It needs no AWS credentials and no network.

const fs = require('fs');
const path = require('path');
const { DEFAULT_LANE, queueId, laneStack } = require('./lanes');
const { alarmActions, monitoring } = require('./monitoring');

// Margin added to the longest timeout of a function that receives from the queue (the launcher's, the
// completion's hand-over) to give the queue's visibility timeout: a message received at the very end
// of an invocation stays invisible until it is certainly over, and then for S more (the staleness
// bound, docs/protocol.md): a start it made is no younger than S when its copy comes back.
const VISIBILITY_MARGIN_SECONDS = 60;

// The launcher stops receiving when less than this much of its Lambda time is left
// (SLUICE_TIME_RESERVE_SECONDS, lib/sluice/launch/settings.py), so it can hand back what it holds.
const TIME_RESERVE_SECONDS = 15;
// Time the launcher needs besides that reserve to do any work: reconcile, then admit a batch.
const MIN_WORKING_SECONDS = 15;
const MIN_LAUNCHER_TIMEOUT = TIME_RESERVE_SECONDS + MIN_WORKING_SECONDS;
// The completion function's timeout: below the queue visibility timeout too, since it also receives
// from the queue. The semaphore function's: below the delivery grace (DELIVERY_GRACE, 60 s,
// lib/sluice/semaphore/step.py), so a hand-off that may still be delivering a grant is never taken over
// while it runs.
const COMPLETION_TIMEOUT_SECONDS = 60;
const SEMAPHORE_TIMEOUT_SECONDS = 30;
// One address, as SNS's email protocol takes it.
const EMAIL = /^[^\s@,;]+@[^\s@,;]+\.[^\s@,;]+$/;

// The LedgerDrift alarm fires when drift stays above 0 for this many ticks in a row.
const DRIFT_TICKS = 3;
// CloudWatch evaluates an alarm over at most one day (periods x evaluation periods).
const MAX_ALARM_RANGE_SECONDS = 86400;
// Alarm period for a cron() schedule, whose interval is not read from the expression.
const CRON_ALARM_PERIOD_SECONDS = 300;

// Lambda function memory, MB (any whole number in between).
const MIN_LAMBDA_MEMORY_MB = 128;
const MAX_LAMBDA_MEMORY_MB = 10240;

const DUPLICATE_POLICIES = ['suppress', 'defer'];
// The payload queue's MessageRetentionPeriod (serverless.yml), in days.
const QUEUE_RETENTION_DAYS = 14;
// Semaphore names and limits (lib/sluice/semaphore/model.py, lib/sluice/semaphore/service.py).
const MAX_SEMAPHORE_NAME = 60;
const MAX_SEMAPHORE_LIMIT = 10000;
// The example workflow's ASL names the semaphore function by this placeholder.
const SEMAPHORE_FUNCTION_PLACEHOLDER = 'SEMAPHORE_FUNCTION_ARN';
const SEMAPHORE_FUNCTION_LOGICAL_ID = 'SemaphoreLambdaFunction';
const STATE_MACHINE_ARN = /^arn:aws[a-z-]*:states:[a-z0-9-]+:\d{12}:stateMachine:[^:\s]{1,80}$/;
// Lanes (the lanes parameter, docs/configuration.md): name:max[:priority[:weight[:fair]]], the rules
// SLUICE_LANES is read by (docs/protocol.md "Lanes"). The lane "default" is the payload queue.
const LANE_NAME = /^[a-z][a-z0-9]*(-[a-z0-9]+)*$/;
const MAX_LANE_NAME = 20;
const MAX_LANES = 20; // the implied default lane included
const MAX_LANE_MAX = 10000;
const MAX_LANE_PRIORITY = 100;
const MAX_LANE_WEIGHT = 100;

function fail(message) {
  throw new Error(`Sluice stack parameters: ${message}`);
}

// `why`, when given, explains the bounds in the message.
function integer(name, raw, min, max, why) {
  const text = String(raw).trim();
  if (!/^\d+$/.test(text)) fail(`${name} must be a whole number, got "${raw}"`);
  const value = Number(text);
  if (value < min || value > max) {
    fail(`${name} must be between ${min} and ${max}, got ${value}` + (why ? `: ${why}` : ''));
  }
  return value;
}

// The LedgerDrift alarm's period: one launcher tick, so that DRIFT_TICKS periods in a row are
// DRIFT_TICKS ticks. CloudWatch wants a multiple of 60 s, and the whole range within a day.
function alarmPeriod(scheduleRate) {
  const rate = /^rate\((\d+) (minute|minutes|hour|hours|day|days)\)$/.exec(scheduleRate);
  if (!rate) return CRON_ALARM_PERIOD_SECONDS;
  const unit = { minute: 60, hour: 3600, day: 86400 }[rate[2].replace(/s$/, '')];
  const seconds = Number(rate[1]) * unit;
  const longest = Math.floor(MAX_ALARM_RANGE_SECONDS / DRIFT_TICKS / 60) * 60;
  return Math.min(Math.max(60, Math.ceil(seconds / 60) * 60), longest);
}

// "db=5,api=2" → [['db', 5], ['api', 2]], with the rules SLUICE_SEMAPHORES is read by.
function semaphoreLimits(text) {
  const out = new Map();
  for (const part of text.split(',').map((p) => p.trim()).filter(Boolean)) {
    const at = part.lastIndexOf('=');
    const name = at < 0 ? '' : part.slice(0, at).trim();
    const number = at < 0 ? '' : part.slice(at + 1).trim();
    if (!name) fail(`semaphores: "${part}" is not name=limit`);
    if (name.length > MAX_SEMAPHORE_NAME || !/^[!-~]+$/.test(name) || /[#|]/.test(name)) {
      fail(`semaphores: bad name "${name}": 1 to ${MAX_SEMAPHORE_NAME} ASCII characters, no '#' '|' ',' or space`);
    }
    if (!/^\d+$/.test(number) || Number(number) > MAX_SEMAPHORE_LIMIT) {
      fail(`semaphores: the limit of "${name}" must be 0 to ${MAX_SEMAPHORE_LIMIT}, got "${number}"`);
    }
    if (out.has(name)) fail(`semaphores: "${name}" is given twice`);
    out.set(name, Number(number));
  }
  return [...out.entries()];
}

// "gpu=arn:aws:states:...:stateMachine:render" → [['gpu', 'arn:...']]: each lane configured, each ARN a
// Standard state machine's in the stack's region (its status events reach this region's rules only).
function parseLaneMachines(text, lanes, region) {
  const out = [];
  for (const part of text.split(',').map((p) => p.trim()).filter(Boolean)) {
    const at = part.indexOf('=');
    const lane = at < 0 ? '' : part.slice(0, at).trim();
    const arn = at < 0 ? '' : part.slice(at + 1).trim();
    if (!lane || !arn) fail(`laneStateMachines: "${part}" : give lane=state-machine-arn`);
    if (!lanes.some((l) => l.name === lane)) {
      fail(`laneStateMachines: "${lane}" is not a lane; the lanes are ${lanes.map((l) => l.name).join(', ')}`);
    }
    if (!STATE_MACHINE_ARN.test(arn)) fail(`laneStateMachines: "${arn}" (lane ${lane}) is not a state machine ARN`);
    if (arn.split(':')[3] !== region) {
      fail(`laneStateMachines: "${arn}" (lane ${lane}) must be in the stack's region ${region}`);
    }
    if (out.some(([l]) => l === lane)) fail(`laneStateMachines: lane "${lane}" is given twice`);
    out.push([lane, arn]);
  }
  return out;
}

// A rate limit (sluice.features.rate_limits): N/second, N/minute or N/hour, N a whole number from 1 to
// 10,000; empty: none. The text as the functions read it.
const RATE = /^([1-9][0-9]{0,5})\/(second|minute|hour)$/;
function parseRate(name, text) {
  const rate = String(text).trim();
  const found = RATE.exec(rate);
  if (rate !== '' && (!found || Number(found[1]) > 10000)) {
    fail(`${name} must be N/second, N/minute or N/hour, N a whole number from 1 to 10000 (or empty), got "${rate}"`);
  }
  return rate;
}

// "gpu=10/second,api=600/minute" → the same text, each lane one of the stack's, once.
function parseLaneRates(text, lanes) {
  const out = [];
  for (const part of String(text).split(',').map((p) => p.trim()).filter(Boolean)) {
    const at = part.indexOf('=');
    const lane = at < 0 ? '' : part.slice(0, at).trim();
    if (!lane || !lanes.some((l) => l.name === lane) || out.some(([l]) => l === lane)) {
      fail(`laneRateLimits: "${part}" is not lane=rate for a lane of the stack, once each (lanes: ${lanes.map((l) => l.name).join(', ') || 'none'})`);
    }
    out.push([lane, parseRate(`laneRateLimits (${lane})`, part.slice(at + 1))]);
  }
  return out.map(([lane, rate]) => `${lane}=${rate}`).join(',');
}

// "gpu:2:1,backfill:8:0:3" → [{ name: 'gpu', max: 2, priority: 1, weight: 1, fair: false, spec: 'gpu:2:1' }, ...],
// the lane "default" last unless named (its max then is maxConcurrency). Empty: the one lane "default".
function parseLanes(text, maxConcurrency) {
  const lanes = [];
  if (text !== '') {
    const parts = text.split(',').map((p) => p.trim());
    for (const part of parts) {
      if (!part) fail(`lanes: an empty lane in "${text}" (name:max[:priority[:weight[:fair]]], comma-separated)`);
      const fields = part.split(':').map((f) => f.trim());
      if (fields.length < 2) fail(`lanes: "${part}" : give name:max[:priority[:weight[:fair]]]`);
      if (fields.length > 5) fail(`lanes: "${part}" : too many fields, at most name:max:priority:weight:fair`);
      if (fields.some((f) => f === '')) fail(`lanes: "${part}" : a field is empty`);
      const [name, max, priority = '0', weight = '1', fair] = fields;
      if (name.length > MAX_LANE_NAME || !LANE_NAME.test(name)) {
        fail(
          `lanes: "${part}" : bad name "${name}": 1 to ${MAX_LANE_NAME} characters, lowercase letters, digits ` +
            `and single hyphens between them, starting with a letter`
        );
      }
      const whole = (field, value, min, most) => {
        if (!/^\d+$/.test(value) || Number(value) < min || Number(value) > most) {
          fail(`lanes: "${part}" : ${field} must be a whole number between ${min} and ${most}`);
        }
        return Number(value);
      };
      const lane = {
        name,
        max: whole('max', max, 0, MAX_LANE_MAX),
        priority: whole('priority', priority, 0, MAX_LANE_PRIORITY),
        weight: whole('weight', weight, 1, MAX_LANE_WEIGHT),
        fair: fair !== undefined,
        spec: fields.join(':'),
      };
      if (fair !== undefined && fair !== 'fair') {
        fail(`lanes: "${part}" : the 5th field may only be "fair", got "${fair}"`);
      }
      if (lanes.some((l) => l.name === name)) fail(`lanes: "${name}" is given twice`);
      // "a-1b" and "a1b" would both be LaneA1bQueue.
      const twin = lanes.find((l) => queueId(l.name) === queueId(name));
      if (twin) {
        fail(`lanes: "${twin.name}" and "${name}" would share the resource name ${queueId(name)}: rename one`);
      }
      lanes.push(lane);
    }
  }
  if (!lanes.some((l) => l.name === DEFAULT_LANE)) {
    lanes.push({ name: DEFAULT_LANE, max: maxConcurrency, priority: 0, weight: 1, fair: false, implied: true });
  }
  if (lanes.length > MAX_LANES) {
    fail(`lanes: at most ${MAX_LANES} lanes, the lane "${DEFAULT_LANE}" included, got ${lanes.length}`);
  }
  return lanes;
}

// An ARN in the stack's own partition, region and account (no Fn::Sub: nothing here looks like a variable).
function ownArn(service, type, ...rest) {
  return {
    'Fn::Join': [
      ':',
      ['arn', { Ref: 'AWS::Partition' }, service, { Ref: 'AWS::Region' }, { Ref: 'AWS::AccountId' }, type, ...rest],
    ],
  };
}

let memo;

async function derive({ resolveVariable }) {
  const stage = String(await resolveVariable('sls:stage'));
  const region = String(await resolveVariable('self:provider.region'));
  if (!/^[a-z0-9-]{1,20}$/.test(stage)) {
    // The stage names queues, the table, the state machine, IAM roles (64-character limit) and the SSM path.
    fail(`stage must be 1 to 20 lowercase letters, digits or hyphens, got "${stage}"`);
  }
  const param = async (name) => {
    const value = await resolveVariable(`param:${name}`);
    return value == null ? '' : String(value).trim();
  };

  const maxConcurrency = integer('maxConcurrency', await param('maxConcurrency'), 1, 10000);
  const launcherTimeout = integer(
    'launcherTimeout',
    await param('launcherTimeout'),
    MIN_LAUNCHER_TIMEOUT,
    900,
    `the launcher stops receiving ${TIME_RESERVE_SECONDS} s before its timeout (SLUICE_TIME_RESERVE_SECONDS) ` +
      `and needs at least ${MIN_WORKING_SECONDS} s more to reconcile and start anything; Lambda allows at most 900 s`
  );
  const visibilityTimeout = Math.max(launcherTimeout, COMPLETION_TIMEOUT_SECONDS) + VISIBILITY_MARGIN_SECONDS;
  // Lambda's own bounds. CPU comes with memory (one vCPU at 1,769 MB): at 128 MB, about 1/14 of one, a
  // tick that fills hundreds of slots at once is slower, hence the parameter (docs/deploy.md).
  const launcherMemory = integer(
    'launcherMemory',
    await param('launcherMemory'),
    MIN_LAMBDA_MEMORY_MB,
    MAX_LAMBDA_MEMORY_MB,
    `Lambda's limits, in MB`
  );
  const claimTimeout = integer('claimTimeout', await param('claimTimeout'), 1, 86400 * 7);
  if (claimTimeout <= visibilityTimeout) {
    fail(
      `claimTimeout (${claimTimeout} s) must exceed the queue visibility timeout ` +
        `(${visibilityTimeout} s = the longer of launcherTimeout ${launcherTimeout} s and the completion's ` +
        `${COMPLETION_TIMEOUT_SECONDS} s, + ${VISIBILITY_MARGIN_SECONDS} s)`
    );
  }
  const retentionDays = integer('retentionDays', await param('retentionDays'), 1, 3650);
  const awaitHorizon = integer('awaitHorizon', await param('awaitHorizon'), 60, 86400 * 3650);
  // An awaited key's record expires retentionDays after its run: a waiter parked longer would see the
  // key as never seen (docs/protocol.md "Awaits").
  if (awaitHorizon >= retentionDays * 86400) {
    fail(
      `awaitHorizon (${awaitHorizon} s) must be under retentionDays (${retentionDays} days = ` +
        `${retentionDays * 86400} s): an awaited key's record must outlive the wait`
    );
  }
  // A stored payload must outlive every message that points at it: the queue keeps one 14 days.
  const payloadExpiryDays = integer(
    'payloadExpiryDays',
    await param('payloadExpiryDays'),
    QUEUE_RETENTION_DAYS + 1,
    3650,
    `a stored payload must outlive the ${QUEUE_RETENTION_DAYS} days a message pointing at it may wait in the queue`
  );
  // The launcher stops receiving TIME_RESERVE_SECONDS before its timeout: lingering longer is cut short.
  const lingerSeconds = integer(
    'lingerSeconds',
    await param('lingerSeconds'),
    0,
    launcherTimeout - TIME_RESERVE_SECONDS,
    `at most launcherTimeout ${launcherTimeout} s less the launcher's ${TIME_RESERVE_SECONDS} s time reserve ` +
      `(SLUICE_TIME_RESERVE_SECONDS): lower lingerSeconds (55 by default) or raise launcherTimeout`
  );
  const maxReceiveCount = integer('maxReceiveCount', await param('maxReceiveCount'), 1, 1000);
  // Claims and starts a tick keeps in flight at once (auto: the room to fill, up to 30, sluice.primitives.fanout),
  // and the StartExecution token bucket it paces them to (0: the region's quota, sluice.launch.settings.start_bucket).
  const startConcurrency = /^auto$/i.test(String(await param('startConcurrency')).trim())
    ? 'auto'
    : integer('startConcurrency', await param('startConcurrency'), 1, 100, 'or auto, the room to fill up to 60');
  // Runs of one concurrency key at once, unless the key has its own cap (sluice.features.keys).
  const keyConcurrency = integer('keyConcurrency', await param('keyConcurrency'), 1, 10000); // maxConcurrency's ceiling
  const startRate = integer('startRate', await param('startRate'), 0, 100000);
  const startBurst = integer('startBurst', await param('startBurst'), 0, 100000);
  const oldestMessageAlarmSeconds = integer(
    'oldestMessageAlarmSeconds',
    await param('oldestMessageAlarmSeconds'),
    60,
    1209600
  );

  const duplicatePolicy = await param('duplicatePolicy');
  if (!DUPLICATE_POLICIES.includes(duplicatePolicy)) {
    fail(`duplicatePolicy must be one of ${DUPLICATE_POLICIES.join(', ')}, got "${duplicatePolicy}"`);
  }

  const scheduleRate = await param('scheduleRate');
  if (!/^(rate|cron)\(.+\)$/.test(scheduleRate)) {
    fail(`scheduleRate must be an EventBridge expression such as "rate(1 minute)", got "${scheduleRate}"`);
  }
  const driftAlarmPeriod = alarmPeriod(scheduleRate);

  // Empty: Sluice creates and drives its sample workflow. Otherwise: an existing state machine, which
  // must be in the stack's region (Step Functions status events only reach the rules of that region).
  const stateMachineArn = await param('stateMachineArn');
  if (stateMachineArn !== '' && !STATE_MACHINE_ARN.test(stateMachineArn)) {
    fail(`stateMachineArn must be empty or a Standard state machine ARN, got "${stateMachineArn}"`);
  }
  if (stateMachineArn !== '' && stateMachineArn.split(':')[3] !== region) {
    fail(`stateMachineArn must be in the stack's region ${region}, got "${stateMachineArn}"`);
  }

  // Optional: the state machine this stack drove before a switch of stateMachineArn, so that
  // reconciliation may still DescribeExecution its executions and free their slots.
  const previousStateMachineArn = await param('previousStateMachineArn');
  if (previousStateMachineArn !== '' && !STATE_MACHINE_ARN.test(previousStateMachineArn)) {
    fail(
      `previousStateMachineArn must be empty or a Standard state machine ARN, got "${previousStateMachineArn}"`
    );
  }
  if (previousStateMachineArn !== '' && previousStateMachineArn.split(':')[3] !== region) {
    fail(`previousStateMachineArn must be in the stack's region ${region}, got "${previousStateMachineArn}"`);
  }

  const alarmTopicArn = await param('alarmTopicArn');
  if (alarmTopicArn !== '' && !/^arn:aws[a-z-]*:sns:[a-z0-9-]+:\d{12}:[^:\s]{1,256}$/.test(alarmTopicArn)) {
    fail(`alarmTopicArn must be empty or an SNS topic ARN, got "${alarmTopicArn}"`);
  }
  // Subscribed to the stack's own topic; an existing topic's subscriptions are its owner's to manage.
  const alarmEmail = await param('alarmEmail');
  if (alarmEmail !== '' && !EMAIL.test(alarmEmail)) {
    fail(`alarmEmail must be empty or one email address, got "${alarmEmail}"`);
  }
  if (alarmEmail !== '' && alarmTopicArn !== '') {
    fail(
      'alarmEmail subscribes to the topic the stack creates: with alarmTopicArn, the stack creates none; ' +
        `subscribe ${alarmEmail} to ${alarmTopicArn} instead, or leave alarmTopicArn empty`
    );
  }

  // Semaphores created when absent, with their first limit; the run-time limit is the CLI's to change.
  const semaphores = semaphoreLimits(await param('semaphores'));
  const semaphoreText = semaphores.map(([name, limit]) => `${name}=${limit}`).join(',');
  const semaphoreSweepRate = await param('semaphoreSweepRate');
  if (!/^(rate|cron)\(.+\)$/.test(semaphoreSweepRate)) {
    fail(`semaphoreSweepRate must be an EventBridge expression such as "rate(1 minute)", got "${semaphoreSweepRate}"`);
  }
  // The state machines whose workflows acquire semaphores: the example workflow, and these. Their
  // ends are routed to the semaphore function, which may answer their task tokens and describe them.
  const users = (await param('semaphoreStateMachineArns'))
    .split(',')
    .map((a) => a.trim())
    .filter(Boolean);
  for (const arn of users) {
    if (!STATE_MACHINE_ARN.test(arn)) fail(`semaphoreStateMachineArns: "${arn}" is not a state machine ARN`);
    if (arn.split(':')[3] !== region) {
      fail(`semaphoreStateMachineArns: "${arn}" is not in the stack's region ${region} (its status events would not arrive)`);
    }
  }
  const service = String(await resolveVariable('self:service'));
  const semaphoreExampleName = `${service}-${stage}-semaphore-example`;
  const semaphoreStateMachineArns = [ownArn('states', 'stateMachine', semaphoreExampleName), ...new Set(users)];
  const semaphoreExecutionArns = [
    ownArn('states', 'execution', semaphoreExampleName, '*'),
    ...[...new Set(users)].map((arn) => {
      const [, partition, , arnRegion, account, , name] = arn.split(':');
      return `arn:${partition}:states:${arnRegion}:${account}:execution:${name}:*`;
    }),
  ];
  // The example workflow's ASL, the semaphore function's ARN put in by CloudFormation.
  const example = JSON.stringify(
    JSON.parse(fs.readFileSync(path.join(__dirname, 'semaphore-example.asl.json'), 'utf8'))
  ).split(JSON.stringify(SEMAPHORE_FUNCTION_PLACEHOLDER));
  const functionArn = { 'Fn::GetAtt': [SEMAPHORE_FUNCTION_LOGICAL_ID, 'Arn'] };
  const semaphoreExampleDefinition = {
    'Fn::Join': ['', example.flatMap((piece, i) => (i === 0 ? [piece] : ['"', functionArn, '"', piece]))],
  };

  // Lanes: a queue and a MAX each (docs/configuration.md). Without the parameter, the one lane "default".
  const lanesText = await param('lanes');
  const lanes = parseLanes(lanesText, maxConcurrency);
  const laneParts = laneStack(lanes, {
    given: lanesText !== '',
    serviceName: `${service}-${stage}`,
    visibilityTimeout,
    maxReceiveCount,
    oldestMessageAlarmSeconds,
    alarmActions,
  });
  const functions = [
    { name: 'launcher', timeout: launcherTimeout },
    { name: 'completion', timeout: COMPLETION_TIMEOUT_SECONDS },
    { name: 'semaphore', timeout: SEMAPHORE_TIMEOUT_SECONDS },
  ];
  const monitoringParts = monitoring({
    functions,
    lanes,
    given: lanesText !== '',
    alarmEmail,
    serviceName: `${service}-${stage}`,
    oldestMessageAlarmSeconds,
  });

  // A lane's own state machine (laneStateMachines: lane=arn,...): the lane starts it instead of the
  // stack's workflow; reconciliation lists it, the completion rule routes its ends, the role may drive it.
  const laneMachines = parseLaneMachines(await param('laneStateMachines'), lanes, region);
  const ownMachines = [...new Set(laneMachines.map(([, arn]) => arn))];
  const stackMachine = {
    'Fn::If': ['CreateWorkflow', ownArn('states', 'stateMachine', `${service}-${stage}-workflow`), { Ref: 'StateMachineArn' }],
  };
  const laneMachineResources =
    ownMachines.length === 0
      ? stackMachine // nothing more than the stack's machine, which DriveStateMachine covers already
      : [
          ...ownMachines,
          ...ownMachines.map((arn) => {
            const [, partition, , arnRegion, account, , name] = arn.split(':');
            return `arn:${partition}:states:${arnRegion}:${account}:execution:${name}:*`;
          }),
        ];
  const laneEnvironment = { ...laneParts.environment };
  if (laneMachines.length > 0) {
    laneEnvironment.SLUICE_LANE_STATE_MACHINES = laneMachines.map(([lane, arn]) => `${lane}=${arn}`).join(',');
  }
  // Rate limits: the stack's, the lanes' and every concurrency key's (none without the parameters).
  const rateLimit = parseRate('rateLimit', await param('rateLimit'));
  const keyRateLimit = parseRate('keyRateLimit', await param('keyRateLimit'));
  const laneRateLimits = parseLaneRates(await param('laneRateLimits'), lanesText === '' ? [] : lanes);
  if (rateLimit) laneEnvironment.SLUICE_RATE_LIMIT = rateLimit;
  if (laneRateLimits) laneEnvironment.SLUICE_LANE_RATE_LIMITS = laneRateLimits;
  if (keyRateLimit) laneEnvironment.SLUICE_KEY_RATE_LIMIT = keyRateLimit;

  // The sample workflow, as the JSON string that AWS::StepFunctions::StateMachine's DefinitionString takes.
  const definitionPath = path.join(__dirname, 'workflow.asl.json');
  const workflowDefinition = JSON.stringify(JSON.parse(fs.readFileSync(definitionPath, 'utf8')));

  return {
    maxConcurrency,
    launcherTimeout,
    launcherMemory,
    visibilityTimeout,
    claimTimeout,
    retentionDays,
    awaitHorizon,
    payloadExpiryDays,
    lingerSeconds,
    maxReceiveCount,
    startConcurrency,
    keyConcurrency,
    startRate,
    startBurst,
    oldestMessageAlarmSeconds,
    duplicatePolicy,
    scheduleRate,
    driftAlarmPeriod,
    driftAlarmTicks: DRIFT_TICKS,
    stateMachineArn,
    previousStateMachineArn,
    alarmTopicArn,
    alarmEmail,
    // Every alarm's AlarmActions and OKActions: the stack's topic, or alarmTopicArn's.
    alarmActions,
    completionTimeout: COMPLETION_TIMEOUT_SECONDS,
    semaphoreTimeout: SEMAPHORE_TIMEOUT_SECONDS,
    workflowDefinition,
    semaphores: semaphoreText,
    semaphoreSweepRate,
    semaphoreStateMachineArns,
    semaphoreExecutionArns,
    semaphoreExampleName,
    semaphoreExampleDefinition,
    lanes: lanes.map(({ name, max, priority, weight, fair }) => ({ name, max, priority, weight, fair })),
    // The payload queue's ARN in IAM statements; with lanes, the list of every lane's queue ARN.
    queueArns: laneParts.queueArns,
    tlsQueues: laneParts.tlsQueues,
    tlsQueueArns: laneParts.tlsQueueArns,
    // The functions' own environment: SLUICE_LANES and SLUICE_LANE_QUEUES, none without the parameter;
    // SLUICE_LANE_STATE_MACHINES with laneStateMachines.
    laneEnvironment,
    // Every state machine the stack starts (the completion rule's), and the lanes' own with their
    // executions (the DriveLaneStateMachines statement; the stack's alone without laneStateMachines).
    machineArns: [stackMachine, ...ownMachines],
    laneMachineResources,
    // The semaphore function's: SLUICE_SEMAPHORES, and the lanes' as the other functions have them.
    semaphoreEnvironment: { SLUICE_SEMAPHORES: semaphoreText, ...laneEnvironment },
    laneResources: laneParts.resources,
    // The alarm topic, the functions' alarms and the dashboard (stack/monitoring.js).
    monitoringResources: monitoringParts,
    // The same numbers as strings, for Lambda environment variables and the SSM parameter value
    // (a whole-value variable keeps its type, and those properties take strings).
    text: {
      maxConcurrency: String(maxConcurrency),
      claimTimeout: String(claimTimeout),
      retentionDays: String(retentionDays),
      awaitHorizon: String(awaitHorizon),
      lingerSeconds: String(lingerSeconds),
      startConcurrency: String(startConcurrency),
      keyConcurrency: String(keyConcurrency),
      startRate: String(startRate),
      startBurst: String(startBurst),
    },
  };
}

// Computed once per run. A failed attempt is not kept: osls first calls this before the `param`
// source exists (and retries once it does).
module.exports = (context) => {
  if (!memo) {
    memo = derive(context);
    memo.catch(() => {
      memo = undefined;
    });
  }
  return memo;
};
