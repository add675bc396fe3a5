'use strict';

// What the lanes parameter adds to the stack (stack/config.js parses and checks it first). Every lane
// but "default" has a FIFO queue of its own, made like the payload queue (the lane "default"):
//   - its queue, dead-lettering to the same dead-letter queue, under the same TLS-only policy;
//   - the same IAM grants as the payload queue (the functions' statements, the producer policy);
//   - SLUICE_LANES and SLUICE_LANE_QUEUES in the functions' environment (docs/protocol.md "Lanes");
//   - outputs with its queue URL, and an oldest-message-age alarm like the payload queue's;
//   - and, with any lane given, a CloudWatch dashboard of the queues and Sluice's metrics.
// Without the parameter none of this is in the template, which is then exactly the one-queue stack.
// Everything is built as CloudFormation JSON with Fn::Join, never Fn::Sub: osls would read a
// "${...}" in a value from this file as one of its own variables.

const DEFAULT_LANE = 'default';
const PAYLOAD_QUEUE = 'PayloadQueue';
const DEAD_LETTER_QUEUE = 'DeadLetterQueue';
// The same as serverless.yml's PayloadQueue: 14 days.
const MESSAGE_RETENTION_SECONDS = 1209600;
// Sluice's own metrics (POWERTOOLS_METRICS_NAMESPACE), with the Powertools "service" dimension.
const METRIC_NAMESPACE = 'Sluice';
// In the dashboard's body, a value CloudFormation puts in: "@@region", or "@@queue:<logical id>" for
// that queue's name.
const PLACEHOLDER = /"@@(region|queue:[A-Za-z0-9]+)"/;

const ref = (logicalId) => ({ Ref: logicalId });
const arn = (logicalId) => ({ 'Fn::GetAtt': [logicalId, 'Arn'] });
const alarmActions = { 'Fn::If': ['HasAlarmTopic', [ref('AlarmTopicArn')], ref('AWS::NoValue')] };

// "gpu-batch" → "GpuBatch"
function pascal(name) {
  return name
    .split('-')
    .map((segment) => segment[0].toUpperCase() + segment.slice(1))
    .join('');
}

const queueId = (name) => `Lane${pascal(name)}Queue`;

// Joins strings and CloudFormation values into one string (a bare string when there is nothing to join).
function join(pieces) {
  const merged = [];
  for (const piece of pieces) {
    if (typeof piece === 'string' && typeof merged[merged.length - 1] === 'string') {
      merged[merged.length - 1] += piece;
    } else {
      merged.push(piece);
    }
  }
  if (merged.length === 0) return '';
  if (merged.length === 1 && typeof merged[0] === 'string') return merged[0];
  return { 'Fn::Join': ['', merged] };
}

function queue(name, { serviceName, visibilityTimeout, maxReceiveCount }) {
  return {
    Type: 'AWS::SQS::Queue',
    Properties: {
      QueueName: `${serviceName}-lane-${name}.fifo`,
      FifoQueue: true,
      ContentBasedDeduplication: false,
      VisibilityTimeout: visibilityTimeout,
      MessageRetentionPeriod: MESSAGE_RETENTION_SECONDS,
      SqsManagedSseEnabled: true,
      RedrivePolicy: {
        deadLetterTargetArn: arn(DEAD_LETTER_QUEUE),
        maxReceiveCount,
      },
    },
  };
}

// The payload queue's OldestMessageAlarm, for one lane's queue.
function oldestMessageAlarm(name, { serviceName, oldestMessageAlarmSeconds }) {
  return {
    Type: 'AWS::CloudWatch::Alarm',
    Properties: {
      AlarmName: `${serviceName}-lane-${name}-oldest-message-age`,
      AlarmDescription: `The oldest queued payload of lane ${name} has waited longer than oldestMessageAlarmSeconds`,
      Namespace: 'AWS/SQS',
      MetricName: 'ApproximateAgeOfOldestMessage',
      Dimensions: [{ Name: 'QueueName', Value: { 'Fn::GetAtt': [queueId(name), 'QueueName'] } }],
      Statistic: 'Maximum',
      Period: 300,
      EvaluationPeriods: 1,
      Threshold: oldestMessageAlarmSeconds,
      ComparisonOperator: 'GreaterThanThreshold',
      TreatMissingData: 'notBreaching',
      AlarmActions: alarmActions,
      OKActions: alarmActions,
    },
  };
}

// One graph per queue metric (a line per lane), Sluice's slots and admissions, drift, the DLQ, and
// each lane's running against its MAX and its starts (the metrics with the dimension lane).
function dashboard(lanes, { serviceName, oldestMessageAlarmSeconds }) {
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
    graph(
      0,
      18,
      'Running vs MAX per lane',
      'Maximum',
      lanes.flatMap((lane) => [
        laneMetric('LaneRunning', lane, { label: `${lane.name} running` }),
        laneMetric('LaneMax', lane, { label: `${lane.name} MAX` }),
      ]),
    ),
    graph(12, 18, 'Starts per lane', 'Sum', lanes.map((lane) => laneMetric('LaneStarted', lane, { label: lane.name }))),
    graph(0, 12, 'Ledger drift', 'Minimum', [sluice('LedgerDrift')]),
    graph(12, 12, 'Dead-lettered payloads', 'Maximum', [
      ['AWS/SQS', 'ApproximateNumberOfMessagesVisible', 'QueueName', queueName(DEAD_LETTER_QUEUE)],
    ]),
  ];
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

// lanes: config.js's parsed lanes (the lane "default" among them); given: whether the parameter was set.
function laneStack(lanes, { given, serviceName, visibilityTimeout, maxReceiveCount, oldestMessageAlarmSeconds }) {
  const settings = { serviceName, visibilityTimeout, maxReceiveCount, oldestMessageAlarmSeconds };
  const others = lanes.filter((lane) => lane.name !== DEFAULT_LANE);
  const laneQueues = join(
    others.flatMap((lane, i) => [`${i === 0 ? '' : ','}${lane.name}=`, ref(queueId(lane.name))])
  );
  const Resources = {};
  const Outputs = {};
  for (const lane of others) {
    const id = queueId(lane.name);
    Resources[id] = queue(lane.name, settings);
    Resources[`Lane${pascal(lane.name)}OldestMessageAlarm`] = oldestMessageAlarm(lane.name, settings);
    Outputs[`${id}Url`] = { Description: `Send payloads of lane ${lane.name} here`, Value: ref(id) };
  }
  if (others.length > 0) {
    Outputs.LaneQueueUrls = {
      Description: 'The queue URL of each lane but default (name=url, comma-separated), as SLUICE_LANE_QUEUES',
      Value: laneQueues,
    };
  }
  if (given) Resources.Dashboard = dashboard(lanes, settings);

  const laneIds = others.map((lane) => queueId(lane.name));
  // The lanes as given, without spaces (the implied lane "default" is not added).
  const named = lanes.filter((lane) => !lane.implied).map((lane) => lane.spec);
  return {
    // The payload queue's IAM resource, or with lanes the list of every lane's queue.
    queueArns: laneIds.length === 0 ? arn(PAYLOAD_QUEUE) : [PAYLOAD_QUEUE, ...laneIds].map(arn),
    // QueueTlsOnlyPolicy's queues and resources: the payload queue, the dead-letter queue, the lanes'.
    tlsQueues: [PAYLOAD_QUEUE, DEAD_LETTER_QUEUE, ...laneIds].map(ref),
    tlsQueueArns: [PAYLOAD_QUEUE, DEAD_LETTER_QUEUE, ...laneIds].map(arn),
    // Merged into the functions' environment: nothing at all without the parameter.
    environment: given ? { SLUICE_LANES: named.join(','), SLUICE_LANE_QUEUES: laneQueues } : {},
    // One more block of serverless.yml's resources (merged with the others).
    resources: { Resources, Outputs },
  };
}

module.exports = { DEFAULT_LANE, pascal, queueId, laneStack };
