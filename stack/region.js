'use strict';

// The stack's region when --region is not given (serverless.yml: `${opt:region, file(stack/region.js)}`).
//
// The order is the one the `sluice` CLI follows, so that `npx sls deploy` and `sluice status` look
// in the same region without being told:
//   1. AWS_REGION (what the AWS SDKs read first)
//   2. AWS_DEFAULT_REGION (what the AWS CLI and boto3 read)
//   3. the `region` of the AWS profile in use, from the AWS config file
//   4. us-east-1
// The profile is the one osls takes credentials from: --aws-profile, AWS_<STAGE>_PROFILE,
// AWS_PROFILE, AWS_DEFAULT_PROFILE, else "default". It needs no AWS credentials and no network.

const fs = require('fs');
const os = require('os');
const path = require('path');

const DEFAULT_REGION = 'us-east-1';

// The `region` of one profile in an AWS config file (`[default]`, `[profile NAME]`), or undefined.
function profileRegion(text, profile) {
  const wanted = profile === 'default' ? ['default', 'profile default'] : [`profile ${profile}`];
  let inProfile = false;
  for (const raw of text.split(/\r?\n/)) {
    const line = raw.trim();
    if (line === '' || line.startsWith('#') || line.startsWith(';')) continue;
    const section = /^\[\s*(.+?)\s*\]$/.exec(line);
    if (section) {
      inProfile = wanted.includes(section[1].replace(/\s+/g, ' '));
      continue;
    }
    const setting = /^region\s*=\s*([^\s#;]+)/.exec(line);
    if (inProfile && setting) return setting[1];
  }
  return undefined;
}

function profileName(env, options, stage) {
  const stageProfile = stage ? env[`AWS_${String(stage).toUpperCase()}_PROFILE`] : undefined;
  return (
    (options && options['aws-profile']) ||
    stageProfile ||
    env.AWS_PROFILE ||
    env.AWS_DEFAULT_PROFILE ||
    'default'
  );
}

function configFile(env) {
  return env.AWS_CONFIG_FILE || path.join(os.homedir(), '.aws', 'config');
}

// The region from an environment (a plain object) and osls' options; exported for the tests.
function resolveRegion(env, options, stage) {
  const fromEnv = (env.AWS_REGION || '').trim() || (env.AWS_DEFAULT_REGION || '').trim();
  if (fromEnv) return fromEnv;
  let text = '';
  try {
    text = fs.readFileSync(configFile(env), 'utf8');
  } catch (error) {
    if (error.code !== 'ENOENT' && error.code !== 'EISDIR') throw error;
  }
  return profileRegion(text, profileName(env, options, stage)) || DEFAULT_REGION;
}

module.exports = ({ options } = {}) => resolveRegion(process.env, options || {}, (options && options.stage) || 'dev');
module.exports.resolveRegion = resolveRegion;
