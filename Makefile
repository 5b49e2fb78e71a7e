# envace — common entry points. `make help` lists them.
# Set-up on a fresh machine is two commands: `make pipeline` and `make test`.

VENV ?= .venv
PY := $(VENV)/bin/python
PROFILE ?= cpu
OVERRIDES ?=
ARGS ?=
PREFECT_PORT ?= 4200
MLFLOW_PORT ?= 5000

# telemetry off for every tool this Makefile runs
export DO_NOT_TRACK := true
export PREFECT_SERVER_ANALYTICS_ENABLED := false
export MLFLOW_DISABLE_TELEMETRY := true
export DVC_NO_ANALYTICS := 1
export DVC_STUDIO_OFFLINE := true
export HF_HUB_OFFLINE := 1
export PREFECT_HOME := $(CURDIR)/.prefect
export PREFECT_API_URL := http://127.0.0.1:$(PREFECT_PORT)/api
# stage commands in dvc.yaml say `python`: make it this venv's
export PATH := $(abspath $(VENV))/bin:$(PATH)

.DEFAULT_GOAL := help
.PHONY: help install test test-e2e pipeline params serve stop ui

help: ## list the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z0-9_-]+:.*## / {printf "  %-10s %s\n", $$1, $$2}' $(MAKEFILE_LIST)
	@echo "  variables: VENV=$(VENV) PROFILE=$(PROFILE) OVERRIDES='$(OVERRIDES)'"

install: ## create/refresh the venv ($(VENV)): torch first, then the resolved set (scripts/install.sh)
	bash scripts/install.sh $(VENV)

test: install ## unit + integration tests (no e2e/slow/gpu); pytest's "no tests ran" (exit 5) fails
	@rc=0; $(PY) -m pytest $(ARGS) || rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test: pytest collected no tests (exit 5) - failing"; exit 1; fi; exit $$rc

test-e2e: install ## end-to-end: smoke profile through `dvc exp run` and a real Prefect server + deployment
	$(PY) -m pytest -m e2e tests/e2e $(ARGS)

params: ## regenerate params.yaml from conf/ (as `dvc exp run -S` does); ARGS='profile=smoke algo=grpo'
	$(PY) -m envace.config $(ARGS)

pipeline: install ## install, then `dvc repro` on the $(PROFILE) profile; prints where results are
	$(PY) -m envace.config profile=$(PROFILE) $(OVERRIDES)
	dvc repro
	@echo ""
	@echo "Done. Tables and plots:  $(CURDIR)/reports/  (report.md, *.csv, *.png)"
	@echo "Metrics per stage:       $(CURDIR)/metrics/*.json   (dvc metrics show)"
	@echo "MLflow runs:             sqlite:///$(CURDIR)/mlflow.db  -> make ui, then http://127.0.0.1:$(MLFLOW_PORT)"
	@test -f .envace/pipeline_run.json && echo "MLflow parent run:       $$(cat .envace/pipeline_run.json | $(PY) -c 'import json,sys; print(json.load(sys.stdin)["run_id"])')" || true

serve: ## start the Prefect server (127.0.0.1:$(PREFECT_PORT)) and serve envace/full-pipeline, in the background
	$(PY) -m flows.server start --port $(PREFECT_PORT)
	@echo "Run it:  PREFECT_API_URL=$(PREFECT_API_URL) $(VENV)/bin/prefect deployment run envace/full-pipeline -p overrides='[\"profile=smoke\"]' --watch"

stop: ## stop the processes `make serve` started (by PID)
	$(PY) -m flows.server stop

ui: ## browse MLflow runs: http://127.0.0.1:$(MLFLOW_PORT)
	MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false $(VENV)/bin/mlflow ui --backend-store-uri sqlite:///mlflow.db \
		--host 127.0.0.1 --port $(MLFLOW_PORT) --workers 1
