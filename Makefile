# envace — common entry points. `make help` lists them.
# Set-up on a fresh machine is two commands: `make pipeline` and `make test`.

VENV ?= .venv
PY := $(VENV)/bin/python
# the main job's profile: the model organism (issue 46: a 1.5M-parameter tool-world LM trained from its
# committed SFT start, where learning shows on 2 cores); PROFILE=cpu is the SmolLM2-135M run with the BFCL-v4
# and tau2 subsets, PROFILE=smoke the whole DAG in minutes. The committed params.yaml is this profile's.
PROFILE ?= organism
# `make science`: the variant x seed matrix of the same profile (PROFILE=cpu: the SmolLM2 plumbing matrix)
SCIENCE_PROFILE ?= $(PROFILE)
OVERRIDES ?=
ARGS ?=
VARIANTS ?= grpo envace per_role
HOME_VARIANT ?= envace
MODELS ?=
PREFECT_PORT ?= 4200
MLFLOW_PORT ?= 5000
SERVE_MODEL ?= smollm2
SCIENCE_JOBS ?= 2
MODEL_PORT ?= 8011

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
.PHONY: help install lint test test-e2e pipeline params ablation scale serve stop ui plots readme-plots serve-model science science-testtime science-testtime-grid

# variables whose $(NAME) in a target's `## ...` text `make help` shows expanded (their values now)
HELP_VARS := VENV PY PROFILE SCIENCE_PROFILE OVERRIDES ARGS VARIANTS HOME_VARIANT MODELS PREFECT_PORT MLFLOW_PORT PREFECT_API_URL SERVE_MODEL MODEL_PORT SCIENCE_JOBS

help: ## list the targets
	@awk -v vars='$(foreach v,$(HELP_VARS),$(v)=$($(v))|)' 'BEGIN {FS = ":.*## "; \
	  n = split(vars, kv, "|"); for (i = 1; i <= n; i++) if (sub(/^ +/, "", kv[i]) >= 0 && (j = index(kv[i], "=")) > 0) \
	    val["$$(" substr(kv[i], 1, j - 1) ")"] = substr(kv[i], j + 1)} \
	  /^[a-zA-Z0-9_-]+:.*## / {text = $$2; for (k in val) while ((p = index(text, k)) > 0) \
	    text = substr(text, 1, p - 1) val[k] substr(text, p + length(k)); printf "  %-10s %s\n", $$1, text}' \
	  $(MAKEFILE_LIST)
	@echo "  variables: VENV=$(VENV) PROFILE=$(PROFILE) OVERRIDES='$(OVERRIDES)'"

INSTALL_SETS ?=
install: ## create/refresh the venv ($(VENV)) from requirements/cpu.lock (hashes checked, CPU torch first); INSTALL_SETS=bench adds TRL
	bash scripts/install.sh $(VENV) $(INSTALL_SETS)

test: install lint ## ruff check + format check, then unit + integration tests (no e2e/slow/gpu); pytest's "no tests ran" (exit 5) fails
	@rc=0; $(PY) -m pytest $(ARGS) || rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test: pytest collected no tests (exit 5) - failing"; exit 1; fi; exit $$rc

lint: install ## ruff check and ruff format --check (pyproject.toml [tool.ruff]: 120 columns, pyflakes, import order, bugbear, pyupgrade)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

test-e2e: install ## end-to-end: smoke profile through `dvc exp run` and a real Prefect server + deployment
	$(PY) -m pytest -m e2e tests/e2e tests/integration $(ARGS)

params: ## regenerate params.yaml from conf/ on $(PROFILE) unless ARGS names a profile; ARGS='profile=smoke algo=grpo'
	$(PY) -m envace.config $(if $(findstring profile=,$(ARGS)),,profile=$(PROFILE)) $(ARGS)

pipeline: install ## install, then `dvc repro` on the $(PROFILE) profile; prints where results are
	$(PY) -m envace.config profile=$(PROFILE) $(OVERRIDES)
	dvc repro
	@echo ""
	@echo "Done. Tables and plots:  $(CURDIR)/reports/  (report.md, *.csv, *.png)"
	@echo "Metrics per stage:       $(CURDIR)/metrics/*.json   (dvc metrics show)"
	@echo "MLflow runs:             sqlite:///$(CURDIR)/mlflow.db  -> make ui, then http://127.0.0.1:$(MLFLOW_PORT)"
	@test -f .envace/pipeline_run.json && echo "MLflow parent run:       $$(cat .envace/pipeline_run.json | $(PY) -c 'import json,sys; print(json.load(sys.stdin)["run_id"])')" || true

# The science matrix (science/dvc.yaml, conf/config.yaml `science:`). `dvc repro` runs one stage at a time,
# so the independent stages of a phase go to `xargs -P $(SCIENCE_JOBS)`, one `dvc repro <stage>` each: DVC
# records each stage in science/dvc.lock and skips (or restores from its run cache) a stage already
# computed. Each runs --single-item, after the phase before it: a plain `dvc repro <stage>` would also
# write-lock every upstream stage's outputs while checking them, which a sibling reading them refuses
# (and the aggregate's dependency on science/metrics would pull the test-time stages in). A failed stage
# fails the target once the others finish.
science_stages = dvc stage list science/dvc.yaml --name-only | grep -E '$(1)'
science_phase = $(call science_stages,$(1)) | xargs -r -P $(SCIENCE_JOBS) -n 1 dvc repro --single-item

science: install ## the science matrix on $(SCIENCE_PROFILE): data, SFT (the organism: its committed start), then SFT eval + variant x seed cells ($(SCIENCE_JOBS) at a time), aggregate; resumable, one line per finished part
	$(PY) -m envace.config profile=$(SCIENCE_PROFILE) $(OVERRIDES)
	dvc repro science/dvc.yaml:sft
	$(call science_phase,:(sft_eval|cell@))
	dvc repro --single-item science/dvc.yaml:aggregate
	@$(PY) -c 'import yaml; s = yaml.safe_load(open("params.yaml"))["science"]; print("Science report: " + s["reports"] + "/science.md   (" + s["json"] + "; per-part files in " + s["metrics"] + "/)")'

science-testtime: install ## test-time sweep on the science cells ($(SCIENCE_JOBS) at a time; after `make science`), then the aggregate
	$(PY) -m envace.config profile=$(SCIENCE_PROFILE) $(OVERRIDES)
	$(call science_phase,:testtime(_base$$|@))
	dvc repro --single-item science/dvc.yaml:aggregate
	@$(PY) -c 'import yaml; s = yaml.safe_load(open("params.yaml"))["science"]; print("Science report: " + s["reports"] + "/science.md")'

# The organism only: the first seed's whole test-time grid on seeds 1 and 2 (science/testtime_grid/dvc.yaml),
# the long base halves first (sorted by the name's half), then the aggregate.
science-testtime-grid: install ## the organism: the whole test-time grid on seeds 1 and 2 too (4 parts, $(SCIENCE_JOBS) at a time; after `make science-testtime`), then the aggregate
	$(PY) -m envace.config profile=$(SCIENCE_PROFILE) $(OVERRIDES)
	dvc stage list science/testtime_grid/dvc.yaml --name-only | sort -t- -k2 | xargs -r -P $(SCIENCE_JOBS) -n 1 dvc repro --single-item
	dvc repro --single-item science/dvc.yaml:aggregate
	@$(PY) -c 'import yaml; s = yaml.safe_load(open("params.yaml"))["science"]; print("Science report: " + s["reports"] + "/science.md")'

# exp_sweep(group, values, home): one `dvc exp run -S profile=$(PROFILE) -S group=value` per value, in
# the workspace, named $(PROFILE)-value (an older experiment of that name is removed first; unchanged
# stages are skipped or restored from DVC's run cache). A sequential `dvc exp run` leaves the
# workspace (params.yaml, dvc.lock, metrics/, plots/, outputs) at the experiment it ran last, so the
# home value runs first (a no-op when the workspace already holds it) and is applied back at the end
# with `dvc exp apply` (files from git, outputs from the DVC cache): the workspace ends at the user's
# own run, every other value lives in an experiment ref (`dvc exp show`).
define exp_sweep
	@set -e; for v in $(filter $(3),$(2)) $(filter-out $(3),$(2)); do \
	  dvc exp remove -q "$(PROFILE)-$$v" >/dev/null 2>&1 || true; \
	  echo "== dvc exp run -S profile=$(PROFILE) -S $(1)=$$v $(addprefix -S ,$(OVERRIDES)) -n $(PROFILE)-$$v"; \
	  dvc exp run -S profile=$(PROFILE) -S $(1)=$$v $(addprefix -S ,$(OVERRIDES)) -n "$(PROFILE)-$$v"; \
	done; \
	if [ -n "$(filter $(3),$(2))" ]; then dvc exp apply "$(PROFILE)-$(3)"; fi
	$(PY) -m envace.reporting.experiments collect
	dvc repro report
	@echo "Ablation and scale tables: $(CURDIR)/reports/ablation.csv, $(CURDIR)/reports/scale.csv (report.md)"
endef

ablation: install ## training variants VARIANTS='$(VARIANTS)' as DVC experiments on $(PROFILE), then the report
	$(call exp_sweep,algo,$(VARIANTS),$(HOME_VARIANT))

scale: install ## models MODELS='smollm2 tiny' (conf/model names; the first stays in the workspace), then the report
	@test -n "$(MODELS)" || { echo "make scale: set MODELS, e.g. MODELS='smollm2 tiny' (names in conf/model/)"; exit 2; }
	$(call exp_sweep,model,$(MODELS),$(firstword $(MODELS)))

serve: ## `prefect server start --background` on 127.0.0.1:$(PREFECT_PORT), then serve envace/full-pipeline in the background
	$(PY) -m flows.server start --port $(PREFECT_PORT)
	@echo "Run it:  PREFECT_API_URL=$(PREFECT_API_URL) $(VENV)/bin/prefect deployment run envace/full-pipeline -p overrides='[\"profile=smoke\"]' --watch"

stop: ## stop what `make serve` started: the serving process (by its PID), then `prefect server stop`; waits until both exited
	$(PY) -m flows.server stop

plots: ## dvc plots show as one offline page (Vega inline): reports/dvc_plots/index.html
	$(PY) -m envace.reporting.dvc_html -o reports/dvc_plots

README_PLOTS := training_curve training_per_role advantages_per_role fidelity_over_training testtime testtime_cost success_vs_real_calls
readme-plots: ## copy the current run's figures (reports/, plots/prepare_data.png) into docs/img/ for the README; refuses stale inputs
	@test -f reports/report.md || { echo "readme-plots: no reports/report.md; run make pipeline first"; exit 1; }
	@! grep -q "STALE" reports/report.md || { echo "readme-plots: reports/report.md has stale inputs; run make pipeline first"; exit 1; }
	@for p in $(README_PLOTS); do cp reports/$$p.png docs/img/$$p.png; done
	cp plots/prepare_data.png docs/img/prepare_data.png
	@echo "docs/img/ now holds the figures of the run in reports/ ($$(head -3 reports/report.md | grep -o 'commit `[0-9a-f]*`'))"

serve-model: ## OpenAI-compatible server for $(SERVE_MODEL) (tiny, smollm2, a model dir) at http://127.0.0.1:$(MODEL_PORT)/v1; foreground, stop: Ctrl-C or kill the PID in .envace/
	$(PY) -m envace.inference.openai_server --model $(SERVE_MODEL) --port $(MODEL_PORT) \
		--pid-file .envace/openai_server_$(MODEL_PORT).pid $(ARGS)

ui: ## browse MLflow runs: http://127.0.0.1:$(MLFLOW_PORT)
	@echo "MLflow UI: http://127.0.0.1:$(MLFLOW_PORT)/#/experiments?workflowType=machine_learning (Model training view)"
	MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false $(VENV)/bin/mlflow ui --backend-store-uri sqlite:///mlflow.db \
		--host 127.0.0.1 --port $(MLFLOW_PORT) --workers 1
