# The explorer (docs/reliability.md, "The explorer"): Sluice's real handlers on in-process moto, every
# AWS call a switch point of a seeded scheduler, the promises checked after every step.
#   make explore                          20 runs from a fresh random seed (printed)
#   make explore SEED=123 STEPS=60        one run of seed 123 (RUNS=n: seeds 123 .. 123+n-1)
#   make explore SEED=123 STEPS=17 SCHEDULE=0,3,1,...   replay the schedule a failure printed
#   make explore-long MINUTES=60          fresh seeds until MINUTES of CPU have passed (the soak's)
#   WITHOUT=forged,unusable               leave producers out (tests/explorer/actors.py, PRODUCERS)
#   SWARM=1                               swarm testing: each run draws which actors and faults it has
# A failure prints its seed, the failure and a shrunk schedule (a make line and a pytest function).
.PHONY: explore explore-long

STEPS ?= 120
EXPLORE := PYTHONHASHSEED=0 PYTHONPATH=lib:. $(PY) -m tests.explorer

explore: $(STAMP)
	$(EXPLORE) --steps $(STEPS) $(if $(SEED),--seed $(SEED)) $(if $(RUNS),--runs $(RUNS)) \
		$(if $(SCHEDULE),--schedule $(SCHEDULE)) $(if $(SHRINK),--shrink $(SHRINK)) $(if $(WITHOUT),--without $(WITHOUT)) $(if $(SWARM),--swarm)

explore-long: $(STAMP)
	$(EXPLORE) --steps $(STEPS) --minutes $(or $(MINUTES),60) $(if $(SEED),--seed $(SEED)) \
		$(if $(SHRINK),--shrink $(SHRINK)) $(if $(WITHOUT),--without $(WITHOUT)) $(if $(SWARM),--swarm)
