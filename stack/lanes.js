'use strict';

// What the lanes parameter adds to the stack (stack/config.js parses and checks it first). Every lane
// but "default" has a FIFO queue of its own, made like the payload queue (the lane "default"):
//   - its queue, dead-lettering to the same dead-letter queue, under the same TLS-only policy;
//   - the same IAM grants as the payload queue (the functions' statements, the producer policy);
//   - SLUICE_LANES and SLUICE_LANE_QUEUES in the functions' environment (docs/protocol.md "Lanes");
//   - outputs with its queue URL, and an oldest-message-age alarm like the payload queue's.
// With any lane given, the dashboard (stack/monitoring.js) draws each lane's queue and metrics.
// Without the parameter none of this is in the template, which is then exactly the one-queue stack.
// Everything is built as CloudFormation JSON with Fn::Join, never Fn::Sub: osls would read a
// "${...}" in a value from this file as one of its own variables.

const DEFAULT_LANE = 'default';
const PAYLOAD_QUEUE = 'PayloadQueue';
const DEAD_LETTER_QUEUE = 'DeadLetterQueue';
// The same as serverless.yml's PayloadQueue: 14 days.
const MESSAGE_RETENTION_SECONDS = 1209600;

const ref = (logicalId) => ({ Ref: logicalId });
const arn = (logicalId) => ({ 'Fn::GetAtt': [logicalId, 'Arn'] });

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
      FifoThroughputLimit: 'perMessageGroupId',
      DeduplicationScope: 'messageGroup',
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
function oldestMessageAlarm(name, { serviceName, oldestMessageAlarmSeconds, alarmActions }) {
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

// lanes: config.js's parsed lanes (the lane "default" among them); given: whether the parameter was set;
// alarmActions: what every alarm notifies (stack/monitoring.js).
function laneStack(
  lanes,
  { given, serviceName, visibilityTimeout, maxReceiveCount, oldestMessageAlarmSeconds, alarmActions }
) {
  const settings = { serviceName, visibilityTimeout, maxReceiveCount, oldestMessageAlarmSeconds, alarmActions };
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

module.exports = { DEFAULT_LANE, join, pascal, queueId, laneStack };
