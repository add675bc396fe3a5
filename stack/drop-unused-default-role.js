'use strict';

// osls always compiles the provider-wide Lambda role (IamRoleLambdaExecution), and
// serverless-iam-roles-per-function uses it as the template for each function's own role but leaves
// it in the stack. Every Sluice function has its own role, so the shared one would be an unused role
// with log permissions on every function's log group: drop it when nothing references it.
// Listed after serverless-iam-roles-per-function in serverless.yml, so its hook runs after that one.

const ROLE = 'IamRoleLambdaExecution';

function references(node, logicalId) {
  if (Array.isArray(node)) return node.some((item) => references(item, logicalId));
  if (node && typeof node === 'object') {
    if (node.Ref === logicalId) return true;
    const getAtt = node['Fn::GetAtt'];
    if (getAtt && (getAtt[0] === logicalId || String(getAtt).startsWith(`${logicalId}.`))) return true;
    if (typeof node['Fn::Sub'] === 'string' && node['Fn::Sub'].includes(`\${${logicalId}`)) return true;
    const dependsOn = node.DependsOn;
    if (dependsOn === logicalId || (Array.isArray(dependsOn) && dependsOn.includes(logicalId))) return true;
    return Object.values(node).some((value) => references(value, logicalId));
  }
  return false;
}

class DropUnusedDefaultRole {
  constructor(serverless, options, { log }) {
    this.serverless = serverless;
    this.log = log;
    this.hooks = { 'before:package:finalize': () => this.drop() };
  }

  drop() {
    const template = this.serverless.service.provider.compiledCloudFormationTemplate;
    if (!template.Resources[ROLE]) return;
    const { [ROLE]: role, ...others } = template.Resources;
    if (references({ Resources: others, Outputs: template.Outputs || {} }, ROLE)) return;
    delete template.Resources[ROLE];
    this.log.verbose(`Removed unused ${ROLE}: every function has its own role`);
  }
}

module.exports = DropUnusedDefaultRole;
