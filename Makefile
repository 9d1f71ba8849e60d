# Two commands on a fresh machine with only python3: `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test test-slow test-fuzz test-validation validate docs-figures bench bench-targets clean

$(PY):
	$(PYTHON) -m venv $(VENV)

$(STAMP): $(PY) pyproject.toml
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/clustersim run experiments/configs/llama3-70b-64xh100.yaml --out results/demo

test: $(STAMP)
	$(PY) -m pytest -q

test-slow: $(STAMP)
	$(PY) -m pytest -q -m slow

# 300 seeded fuzz draws through `clustersim run`, invariants checked (experiments/fuzz.py; ~2-5 min)
test-fuzz: $(STAMP)
	$(PY) -m pytest -q -m fuzz

# step-time accuracy regression test (vTrain set + the documented H100 subset, ~10 min)
test-validation: $(STAMP)
	$(PY) -m pytest -q -m validation

# every reference set in full: predictions CSVs, the per-source table, results/validation/scatter.png;
# then the committed prediction tables (experiments/predictions/) and the docs' accuracy figures
validate: $(STAMP)
	$(PY) experiments/validate_all.py --workers 2
	$(PY) experiments/docs_figures.py --import-predictions results/validation
	$(PY) experiments/docs_figures.py --write

# the figures README.md and docs/ quote, regenerated in place (and the README's picture)
docs-figures: $(STAMP)
	$(PY) experiments/docs_figures.py --write

bench: $(STAMP)
	$(PY) benchmarks/bench_maxmin.py
	$(PY) benchmarks/bench_routing.py
	$(PY) experiments/bench_scale.py --moe
	$(PY) benchmarks/bench_search.py

# the pinned scale questions through the CLI end to end, against their targets (minutes;
# --all adds the long ones)
bench-targets: $(STAMP)
	$(PY) benchmarks/bench_targets.py --profile

clean:
	rm -rf $(VENV) build *.egg-info
