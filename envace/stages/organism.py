"""Stage ``organism``: build the model organism (``envace.models.toolworld_lm``) and ``save_pretrained`` it.

Reads the build settings from ``science/organism/organism.yaml`` (``organism:`` = ``OrganismConfig``
fields, ``out:`` = the model directory); trailing ``key=value`` arguments override single fields
(``hidden=96``), ``--out`` the directory. Writes the HF model + tokenizer and ``organism.json`` (config,
parameter count, vocabulary, weights and tokenizer SHA-256). Deterministic: the same settings rebuild
byte-identical weights and tokenizer.

    python -m envace.stages.organism [--params science/organism/organism.yaml] [--out DIR] [key=value ...]
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

import yaml

PARAMS = "science/organism/organism.yaml"


def _value(text: str) -> Any:
    return yaml.safe_load(text)


def settings(params: str | Path, overrides: list[str]) -> tuple[dict[str, Any], str]:
    """(OrganismConfig fields, output directory) from the params file plus ``key=value`` overrides."""
    data = yaml.safe_load(Path(params).read_text())
    fields = dict(data.get("organism") or {})
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"organism: override {item!r} is not key=value")
        fields[key.removeprefix("organism.")] = _value(value)
    return fields, str(data.get("out", "data/organism/toolworld_lm"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m envace.stages.organism", description=__doc__.split("\n\n")[0])
    parser.add_argument("--params", default=PARAMS)
    parser.add_argument("--out", default=None)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("overrides", nargs="*", metavar="key=value")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    import torch

    torch.set_num_threads(args.threads)
    from envace.models.toolworld_lm import OrganismConfig, save_organism

    fields, out = settings(args.params, list(args.overrides))
    manifest = save_organism(OrganismConfig.from_mapping(fields), args.out or out)
    print(json.dumps({k: manifest[k] for k in ("parameters", "vocab_size", "weights_sha256", "tokenizer_sha256")}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
