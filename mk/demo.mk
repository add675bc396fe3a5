# `make demo`: Sluice end to end on an embedded AWS (docs/demo.md). Packages the stack with osls,
# starts a moto server on 127.0.0.1 (a free port), deploys into it, runs a batch through the deployed
# launcher and completion handlers, and writes a summary and a chart to demo-out/.
#
#   make demo                                              200 payloads, MAX 10
#   make demo DEMO_ARGS="--max 5 --count 50 --seed 3"
#   make demo DEMO_ARGS="--payloads my-payloads.jsonl"
#
# Exit status: 0 when MAX was never exceeded and every message is accounted for, 1 otherwise.

DEMO_ARGS ?=

.PHONY: demo

demo: $(STAMP) node_modules/.installed
	$(PY) -m sluice.local.demo $(DEMO_ARGS)
