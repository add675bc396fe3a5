# Packaging: `make package` builds the deployable stack offline (no AWS account, no credentials) and
# lints the CloudFormation template it produces. Included by the top-level Makefile.
#
#   make package                      stage dev
#   make package STAGE=prod SLS_ARGS='--param="maxConcurrency=25"'
#
# The npm side (osls and its two plugins) is pinned in package-lock.json; checkov lives in its own
# venv because its dependencies clash with the pins in requirements/dev.txt.

STAGE ?= dev
SLS_ARGS ?=
TEMPLATE := .serverless/cloudformation-template-update-stack.json
CHECKOV_VENV := .venv-checkov
CHECKOV_STAMP := $(CHECKOV_VENV)/.installed

# Packaging must not need, or find, any AWS credentials: drop the profile settings and hand osls
# placeholder keys (its AWS SDK setup wants a region and some credentials to exist, but package makes
# no AWS call).
OFFLINE_AWS := env -u AWS_PROFILE -u AWS_DEFAULT_PROFILE -u AWS_SESSION_TOKEN \
	AWS_ACCESS_KEY_ID=packaging-needs-no-credentials \
	AWS_SECRET_ACCESS_KEY=packaging-needs-no-credentials \
	AWS_REGION=us-east-1 AWS_DEFAULT_REGION=us-east-1 \
	AWS_CONFIG_FILE=/dev/null AWS_SHARED_CREDENTIALS_FILE=/dev/null

# checkov offline: without these it looks up the network and can stall.
CHECKOV_OFFLINE := BC_SKIP_MAPPING=TRUE CKV_SKIP_PACKAGE_UPDATE_CHECK=true

.PHONY: package package-clean

node_modules/.installed: package.json package-lock.json .npmrc
	npm ci --no-audit --no-fund
	touch $@

$(CHECKOV_STAMP): stack/checkov-requirements.txt
	$(PYTHON) -m venv $(CHECKOV_VENV)
	$(CHECKOV_VENV)/bin/python -m pip install -q --upgrade pip==24.3.1
	$(CHECKOV_VENV)/bin/python -m pip install -q -r stack/checkov-requirements.txt
	touch $@

package: node_modules/.installed $(STAMP) $(CHECKOV_STAMP)
	rm -rf .serverless
	$(OFFLINE_AWS) npx --no-install osls package --stage $(STAGE) $(SLS_ARGS)
	$(VENV)/bin/cfn-lint $(TEMPLATE)
	$(CHECKOV_OFFLINE) $(CHECKOV_VENV)/bin/checkov -f $(TEMPLATE) --framework cloudformation \
		--compact --quiet --config-file .checkov.yaml
	@echo "Packaged stage $(STAGE): .serverless/sluice.zip and $(TEMPLATE) (cfn-lint and checkov clean)"

package-clean:
	rm -rf .serverless node_modules $(CHECKOV_VENV)
