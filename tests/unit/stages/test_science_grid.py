"""The first seed's whole test-time grid on further seeds (envace.stages.science_grid and its dvc.yaml): each half
runs exactly what stage testtime / testtime_base runs on the first seed, into files of its own."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from envace.config.load import compose, load_params, to_plain
from envace.reporting.science_stats import GRID_HALVES
from envace.stages.science import part_overrides
from envace.stages.science_grid import PART_OF_HALF, grid_metrics, grid_overrides

ROOT = Path(__file__).resolve().parents[3]


def _stages(path: str) -> dict:
    return yaml.safe_load((ROOT / path).read_text())["stages"]


@pytest.mark.parametrize(
    ("seed", "half", "message"),
    [
        (0, "trained", "not one of the matrix's further seeds"),  # the first seed: stages testtime, testtime_base
        (9, "base", "not one of the matrix's further seeds"),
        (1, "oracle", "--half must be one of"),
    ],
)
def test_a_seed_or_half_the_grid_does_not_run_is_refused(seed, half, message):
    s = compose(["profile=organism"]).science
    with pytest.raises(ValueError, match=message):
        grid_overrides(s, seed, half)


@pytest.mark.parametrize("half", GRID_HALVES)
def test_each_half_runs_the_first_seeds_grid_into_its_own_files(tmp_path, half):
    """Composed as envace.science.run_part composes a part (params.yaml, the part's overrides, then the
    grid's): the seed's stage config equals the first seed's but for the paths."""
    cfg = compose(["profile=organism"])
    params = tmp_path / "params.yaml"
    OmegaConf.save(cfg, params)
    s = cfg.science
    first = int(s.seeds[0])
    part = PART_OF_HALF[half]
    grid = grid_overrides(s, 2, half)
    as_seed = load_params(params, grid)  # what run_part loads: science.seeds=[2], 2 is the first seed
    (overrides,) = part_overrides(as_seed, part, "envace", 2)
    stage = load_params(params, [*overrides, *grid])
    (reference,) = part_overrides(cfg, part, "envace", first)
    ref = load_params(params, reference)
    for key in ("n_attempts_grid", "modes", "rehearsers", "n_tasks", "split", "max_n_by_mode"):
        assert to_plain(stage.rehearsal[key]) == to_plain(ref.rehearsal[key]), key
    assert len(stage.rehearsal.modes) == 2 and stage.seed == 2
    assert stage.paths.metrics == stage.paths.plots == grid_metrics(s, half, "envace-seed2")
    assert stage.paths.metrics == f"{s.metrics}/full_grid/{half}/testtime/envace-seed2"
    assert stage.paths.rehearsal == f"{s.dir}/full_grid/{half}/envace-seed2"
    # neither the first seed's files nor those of stage testtime for seed 2
    assert stage.paths.metrics not in (ref.paths.metrics, f"{s.metrics}/testtime/envace-seed2")


def test_the_grid_stages_are_the_test_time_stages_on_further_seeds():
    grid = _stages("science/testtime_grid/dvc.yaml")["testtime_grid"]
    testtime = _stages("science/dvc.yaml")["testtime"]
    seeds = to_plain(compose(["profile=organism"]).science.seeds)
    assert set(grid["matrix"]["seed"]) <= set(seeds[1:]) and len({seeds[0], *grid["matrix"]["seed"]}) >= 3
    assert tuple(grid["matrix"]["half"]) == GRID_HALVES
    # the same code and inputs as stage testtime (plus this module), the same params but the other seeds' grid,
    # which the whole grid does not read
    assert set(grid["deps"]) == {*testtime["deps"], "envace/stages/science_grid.py"}
    assert set(grid["params"]) == set(testtime["params"]) - {"science.testtime_other_seeds_n_attempts_grid"}
    (out,) = (next(iter(o)) for o in grid["outs"])
    assert out == "${science.metrics}/full_grid/${item.half}/testtime/${science.testtime_variant}-seed${item.seed}"
    assert grid["cmd"] == "python -m envace.stages.science_grid --seed ${item.seed} --half ${item.half}"
