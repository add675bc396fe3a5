'use strict';

// What the stack adds so that someone hears of trouble (docs/deploy.md "Alarms", the runbook in
// docs/operations.md "Alarms"):
//   - the SNS topic every alarm notifies, unless alarmTopicArn names one (condition CreateAlarmTopic),
//     and alarmEmail's subscription to it;
//   - for each function, alarms on its errors, its throttles and a duration near its timeout;
//   - the CloudWatch dashboard: the queues of every lane, Sluice's metrics and the functions'.
// The queue and drift alarms are in serverless.yml, a lane's in stack/lanes.js; all notify alarmActions.
// Built as CloudFormation JSON with Fn::Join, never Fn::Sub: osls would read a "${...}" in a value
// from this file as one of its own variables.

const { DEFAULT_LANE, join, queueId } = require('./lanes');

const PAYLOAD_QUEUE = 'PayloadQueue';
const DEAD_LETTER_QUEUE = 'DeadLetterQueue';
// Sluice's own metrics (POWERTOOLS_METRICS_NAMESPACE), with the Powertools "service" dimension.
const METRIC_NAMESPACE = 'Sluice';
// In the dashboard's body, a value CloudFormation puts in: "@@region", or "@@queue:<logical id>" for
// that queue's name.
const PLACEHOLDER = /"@@(region|queue:[A-Za-z0-9]+)"/;
// A function's alarms look at 5-minute periods and fire when 2 of the last 3 breach: a failure that
// lasts pages within 10 minutes, a one-off (a throttled call, one slow cold start) does not.
const FUNCTION_ALARM_PERIOD = 300;
const FUNCTION_ALARM_PERIODS = 3;
const FUNCTION_ALARM_BREACHES = 2;
// Duration near the timeout: 90% of it; the launcher works until its 15 s time reserve
// (SLUICE_TIME_RESERVE_SECONDS) and then hands back, so it alarms only within 5 s of its timeout.
const NEAR_TIMEOUT = 0.9;
const LAUNCHER_TIMEOUT_MARGIN_SECONDS = 5;

const ref = (logicalId) => ({ Ref: logicalId });
// Every alarm's AlarmActions and OKActions: the stack's topic, or the one alarmTopicArn names.
const alarmActions = [{ 'Fn::If': ['CreateAlarmTopic', ref('AlarmTopic'), ref('AlarmTopicArn')] }];

// The duration alarm's threshold, ms.
function durationThreshold({ name, timeout }) {
  const seconds = name === 'launcher' ? timeout - LAUNCHER_TIMEOUT_MARGIN_SECONDS : timeout * NEAR_TIMEOUT;
  return Math.round(seconds * 1000);
}

// The three alarms of one function: { logicalId: resource }.
function functionAlarms(fn, serviceName) {
  const logical = `${fn.name[0].toUpperCase()}${fn.name.slice(1)}`;
  const alarm = (metric, description, statistic, threshold) => ({
    Type: 'AWS::CloudWatch::Alarm',
    Properties: {
      AlarmName: `${serviceName}-${fn.name}-${metric.toLowerCase()}`,
      AlarmDescription: description,
      Namespace: 'AWS/Lambda',
      MetricName: metric,
      Dimensions: [{ Name: 'FunctionName', Value: ref(`${logical}LambdaFunction`) }],
      Statistic: statistic,
      Period: FUNCTION_ALARM_PERIOD,
      EvaluationPeriods: FUNCTION_ALARM_PERIODS,
      DatapointsToAlarm: FUNCTION_ALARM_BREACHES,
      Threshold: threshold,
      ComparisonOperator: 'GreaterThanThreshold',
      TreatMissingData: 'notBreaching',
      AlarmActions: alarmActions,
      OKActions: alarmActions,
    },
  });
  const limit = durationThreshold(fn);
  return {
    [`${logical}ErrorsAlarm`]: alarm('Errors', `The ${fn.name} function failed (errors or timeouts)`, 'Sum', 0),
    [`${logical}ThrottlesAlarm`]: alarm('Throttles', `Lambda refused to run the ${fn.name} function (throttled)`, 'Sum', 0),
    [`${logical}DurationAlarm`]: alarm(
      'Duration',
      `The ${fn.name} function ran longer than ${limit / 1000} s of its ${fn.timeout} s timeout`,
      'Maximum',
      limit
    ),
  };
}

// One graph per queue metric (a line per lane), Sluice's slots and admissions, drift, the DLQ, the
// functions' errors, throttles and duration; with lanes, each lane's running against its MAX and its
// starts (the metrics with the dimension lane, which only a stack with lanes emits).
function dashboard(lanes, given, functions, { serviceName, oldestMessageAlarmSeconds }) {
  const queueName = (logicalId) => `@@queue:${logicalId}`;
  const perLane = (metric) =>
    lanes.map((lane) => [
      'AWS/SQS',
      metric,
      'QueueName',
      queueName(lane.name === DEFAULT_LANE ? PAYLOAD_QUEUE : queueId(lane.name)),
      { label: lane.name },
    ]);
  const sluice = (metric, ...options) => [METRIC_NAMESPACE, metric, 'service', serviceName, ...options];
  // The lane metrics (handlers/_shared.py): dimensions service and lane.
  const laneMetric = (metric, lane, ...options) => [
    METRIC_NAMESPACE,
    metric,
    'service',
    serviceName,
    'lane',
    lane.name,
    ...options,
  ];
  const lambda = (metric, fn, ...options) => [
    'AWS/Lambda',
    metric,
    'FunctionName',
    `${serviceName}-${fn.name}`,
    { label: fn.name, ...options[0] },
  ];
  const graph = (x, y, title, stat, metrics, extra = {}) => ({
    type: 'metric',
    x,
    y,
    width: 12,
    height: 6,
    properties: { title, region: '@@region', view: 'timeSeries', stat, period: 60, metrics, ...extra },
  });
  const widgets = [
    graph(0, 0, 'Queued payloads per lane', 'Maximum', perLane('ApproximateNumberOfMessagesVisible')),
    graph(12, 0, 'Oldest queued payload per lane (s)', 'Maximum', perLane('ApproximateAgeOfOldestMessage'), {
      annotations: { horizontal: [{ label: 'oldestMessageAlarmSeconds', value: oldestMessageAlarmSeconds }] },
    }),
    graph(0, 6, 'Slots: running, MAX, free', 'Maximum', [
      sluice('Running'),
      sluice('Max'),
      sluice('FreeSlots', { stat: 'Minimum' }),
    ]),
    graph(12, 6, 'Admissions', 'Sum', [
      sluice('Started'),
      sluice('Released'),
      sluice('Duplicates'),
      sluice('Invalid'),
    ]),
    graph(0, 12, 'Ledger drift', 'Minimum', [sluice('LedgerDrift')]),
    graph(12, 12, 'Dead-lettered payloads', 'Maximum', [
      ['AWS/SQS', 'ApproximateNumberOfMessagesVisible', 'QueueName', queueName(DEAD_LETTER_QUEUE)],
    ]),
    graph(0, 18, 'Function errors and throttles', 'Sum', [
      ...functions.map((fn) => lambda('Errors', fn, { label: `${fn.name} errors` })),
      ...functions.map((fn) => lambda('Throttles', fn, { label: `${fn.name} throttles` })),
    ]),
    graph(
      12,
      18,
      'Function duration, longest (ms)',
      'Maximum',
      functions.map((fn) => lambda('Duration', fn)),
      {
        annotations: {
          horizontal: functions.map((fn) => ({ label: `${fn.name} alarm`, value: durationThreshold(fn) })),
        },
      }
    ),
  ];
  if (given) {
    widgets.push(
      graph(
        0,
        24,
        'Running vs MAX per lane',
        'Maximum',
        lanes.flatMap((lane) => [
          laneMetric('LaneRunning', lane, { label: `${lane.name} running` }),
          laneMetric('LaneMax', lane, { label: `${lane.name} MAX` }),
        ])
      ),
      graph(12, 24, 'Starts per lane', 'Sum', lanes.map((lane) => laneMetric('LaneStarted', lane, { label: lane.name })))
    );
  }
  // split() with a capturing group: text, placeholder, text, placeholder, ..., text.
  const pieces = JSON.stringify({ widgets })
    .split(PLACEHOLDER)
    .map((piece, i) => {
      if (i % 2 === 0) return piece;
      const value = piece === 'region' ? ref('AWS::Region') : { 'Fn::GetAtt': [piece.slice(6), 'QueueName'] };
      return ['"', value, '"'];
    });
  return {
    Type: 'AWS::CloudWatch::Dashboard',
    Properties: { DashboardName: serviceName, DashboardBody: join(pieces.flat()) },
  };
}

// functions: [{ name, timeout }] of every function in serverless.yml; lanes: config.js's parsed lanes;
// given: whether the lanes parameter was set; alarmEmail: checked by config.js, '' for none.
function monitoring({ functions, lanes, given, alarmEmail, serviceName, oldestMessageAlarmSeconds }) {
  const Resources = {
    AlarmTopic: {
      Type: 'AWS::SNS::Topic',
      Condition: 'CreateAlarmTopic',
      // Not encrypted: CloudWatch can publish to an encrypted topic only under a customer managed key
      // whose policy lets it (.checkov.yaml); the notifications hold alarm names and states only.
      Properties: { TopicName: `${serviceName}-alarms`, DisplayName: `Sluice alarms (${serviceName})` },
    },
  };
  if (alarmEmail !== '') {
    Resources.AlarmEmailSubscription = {
      Type: 'AWS::SNS::Subscription',
      Condition: 'CreateAlarmTopic',
      Properties: { Protocol: 'email', Endpoint: alarmEmail, TopicArn: ref('AlarmTopic') },
    };
  }
  for (const fn of functions) Object.assign(Resources, functionAlarms(fn, serviceName));
  Resources.Dashboard = dashboard(lanes, given, functions, { serviceName, oldestMessageAlarmSeconds });
  const Outputs = {
    AlarmTopicArn: {
      Description: 'The SNS topic every alarm notifies when it fires and when it clears',
      Value: alarmActions[0],
    },
  };
  return { Resources, Outputs };
}

module.exports = { alarmActions, durationThreshold, monitoring };
