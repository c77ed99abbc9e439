# h5batch: `make convert` and `make test` are all a fresh machine needs.
# Each target bootstraps .venv from pyproject.toml + constraints.txt when it is missing or stale.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.h5batch-installed
PYC    := $(VENV)/.h5batch-compiled
PEERS  := $(VENV)/.h5batch-peers
JOB    ?= jobs/demo.yaml
ARGS   ?=
BENCH  ?= --quick
PYTEST_ARGS ?=
# The test files run on TEST_JOBS xdist workers, one file per worker at a time (TEST_JOBS=0:
# one after another). On the 2-core CI machine 2 gave 11 min 11 s of pytest for 694 tests,
# against 12 min 22 s serial for 674: most tests keep both cores busy themselves (clusters,
# writer and decoder processes). The leak checks count only their own runs' segments.
TEST_JOBS ?= 2

.PHONY: venv peers convert test bench lint clean distclean

$(STAMP): pyproject.toml constraints.txt requirements-s3test.txt requirements-s3test-nodeps.txt
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[torch,bench,cluster,audio,features,dev,s3]'
	$(BIN)/python -m pip install -q -c constraints.txt -r requirements-s3test.txt
	$(BIN)/python -m pip install -q -c constraints.txt --no-deps -r requirements-s3test-nodeps.txt
	@touch $(STAMP)

# An editable install compiles no Python, and with PYTHONDONTWRITEBYTECODE set (as many
# container images do) every run compiled h5batch's ~150 modules again (0.5-0.8 s of each
# command), and after an edit the edited ones (a 100,000-file sync with none compiled:
# ~0.55 s against ~0.45): compile what changed before each command.
$(PYC): $(STAMP) $(wildcard h5batch/*.py h5batch/*/*.py)
	$(BIN)/python -m compileall -q h5batch
	@touch $(PYC)

venv: $(PYC)

# The peers of the full bench (WebDataset, LitData; requirements-peers.txt says why two steps).
$(PEERS): $(STAMP) requirements-peers.txt requirements-peers-nodeps.txt
	$(BIN)/python -m pip install -q -c constraints.txt -r requirements-peers.txt
	$(BIN)/python -m pip install -q -c constraints.txt --no-deps -r requirements-peers-nodeps.txt
	@touch $(PEERS)

peers: $(PEERS)

convert: $(PYC)
	$(BIN)/h5batch convert $(JOB) $(ARGS)

test: $(PYC)
	$(BIN)/python -m pytest -q -n $(TEST_JOBS) --dist loadfile $(PYTEST_ARGS)

# Quick mode runs without the peers; any other BENCH (the full mode) installs them first.
bench: $(PYC) $(if $(findstring --quick,$(BENCH)),,$(PEERS))
	$(BIN)/h5batch bench $(BENCH)

lint: $(PYC)
	$(BIN)/ruff check h5batch tests benchmarks

clean:
	rm -rf out data/demo data/paired_audio data/bench .pytest_cache .ruff_cache dask-worker-space

distclean: clean
	rm -rf $(VENV) data bench/results
