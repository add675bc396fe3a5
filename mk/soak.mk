# make soak: the long run of the reliability suite's property tests (docs/reliability.md): the launcher's
# and its two focused mixes, the semaphore step's and @exclusive's (the moto-backed ones run a quarter of
# SOAK_EXAMPLES).
#   SOAK_EXAMPLES  programs to run (default 100)    SOAK_STEPS  actions per program, at most (default 50)
#   SOAK_SEED      Hypothesis seed (random unless given; printed, so a run can be repeated)
#   SOAK_EXPLORE_MINUTES  CPU minutes of the explorer after the property tests (mk/explore.mk; default 30)
# A failure shrinks to a short program, printed as Python with its @reproduce_failure blob, and is
# kept in .hypothesis/examples: the next `make soak` replays it first, whatever the seed.
SOAK_EXAMPLES ?= 100
SOAK_STEPS ?= 50
SOAK_REPORT ?= .hypothesis/soak-report.json
SOAK_EXPLORE_MINUTES ?= 30
# The focused suites (keys; awaits, run-once and effects): 3 programs each in `make test`, the soak's here.
SOAK_FOCUSED := test_the_focused_suite_passes_within_its_budget test_the_keys_focused_suite_passes_within_its_budget
# Whole searches for variants that `make test` catches with the program each found (test_suite_programs.py).
SOAK_VARIANTS := test_the_promises_alone_catch_the_counter test_effects_sent_on_every_event_are_caught_by_the_suite \
	test_a_claim_that_ignores_sluice_once_is_caught_by_the_suite test_a_counter_decremented_per_event_is_caught \
	test_a_keyed_claim_that_ignores_the_keys_cap_is_caught_by_the_property_suite \
	test_a_hand_over_whose_claim_keeps_no_lease_is_caught
ifndef SOAK_SEED
SOAK_SEED := $(shell od -An -N4 -tu4 /dev/urandom | tr -d ' ')
endif

.PHONY: soak
soak: $(STAMP)
	@echo "soak: $(SOAK_EXAMPLES) programs of up to $(SOAK_STEPS) actions, seed $(SOAK_SEED)"
	@echo "repeat with: make soak SOAK_SEED=$(SOAK_SEED) SOAK_EXAMPLES=$(SOAK_EXAMPLES) SOAK_STEPS=$(SOAK_STEPS)"
	HYPOTHESIS_PROFILE=soak SOAK_EXAMPLES=$(SOAK_EXAMPLES) SOAK_STEPS=$(SOAK_STEPS) RELIABILITY_REPORT=$(SOAK_REPORT) \
		$(VENV)/bin/pytest -q --timeout=0 tests/reliability/test_stateful.py \
		tests/reliability/test_semaphore_stateful.py tests/reliability/test_exclusive_stateful.py \
		$(addprefix tests/reliability/test_broken_variants.py::,$(SOAK_FOCUSED) $(SOAK_VARIANTS)) \
		--hypothesis-seed=$(SOAK_SEED) --hypothesis-show-statistics
	$(MAKE) --no-print-directory explore-long MINUTES=$(SOAK_EXPLORE_MINUTES)
	@echo "soak: seed $(SOAK_SEED); figures in $(SOAK_REPORT)"
