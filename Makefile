PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
TORCH_VERSION := 2.13.0

.PHONY: setup kernels test demo bench clean

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==$(TORCH_VERSION)
	$(PY) -m pip install --quiet -e '.[test]'
	touch $@

setup: $(VENV)/.installed

# the statistics kernels and the recorder's C++ gradient taps, built for this machine once (about 30 s and 20 s)
# and loaded from then on
kernels: setup
	$(PY) -c "from comgra_ndbg.stats import parallel; parallel.warm_up()"
	$(PY) -c "from comgra_ndbg.recorder import native; native.warm_up()"

test: kernels
	$(PY) -m pytest

demo: setup
	$(PY) -m comgra_ndbg.cli demo $(DEMO_ARGS)

bench: kernels
	$(PY) benchmarks/overhead.py
	$(PY) -m benchmarks.adaptive
	$(PY) benchmarks/neuraldbg_overhead.py
	$(PY) -m benchmarks.whole_run
	$(PY) -m benchmarks.tiers_side_by_side
	$(PY) -m benchmarks.tiers_side_by_side --width 1024 --batch 32 --steps 300
	$(PY) benchmarks/integrations_overhead.py
	$(PY) benchmarks/gpu_overhead.py
	$(PY) benchmarks/read_timeline.py
	$(PY) benchmarks/graph_layout.py
	$(PY) benchmarks/gui_latency.py
	$(PY) -m benchmarks.diagbench
	$(PY) -m benchmarks.peers

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
