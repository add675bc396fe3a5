# Benchmarks (docs/benchmarks.md): Sluice against the published launcher patterns, in virtual time.
#   make bench              full run: bench/results.json and the plots in docs/img/ (a few minutes on 2 cores)
#   make bench QUICK=1      smaller scale, under a minute: bench/out/
#   make bench SEED=123     another seed (the default is fixed, so every run gives the same numbers)
#   python -m bench --oracle-only   Sluice as deployed against the oracles alone: bench/out/results-oracle.json
#   python -m bench.rates_bench     the API-quota workload under rateLimit=120/minute: bench/out/rates.json
.PHONY: bench

bench: $(STAMP)
	PYTHONPATH=lib:. $(PY) -m bench $(if $(filter 1 yes true,$(QUICK)),--quick) $(if $(SEED),--seed $(SEED))
	PYTHONPATH=lib:. $(PY) -m bench.rates_bench
