"""The toy stage's command: train-toy (`anisweep train-toy --help`)."""

from __future__ import annotations

from anisweep.arguments import json_value


def cmd_train_toy(args) -> None:
    import dataclasses

    from anisweep.toy.train import ToySpec, train_toy

    spec = dict(args.spec)
    arch, seed, steps = spec.pop("arch"), spec.pop("seed", 0), spec.pop("steps")
    fields = {f.name for f in dataclasses.fields(ToySpec)}
    unknown = sorted(set(spec) - fields)
    if unknown:
        raise SystemExit(f"toy spec: unknown key(s) {unknown}; valid: {sorted(fields | {'arch', 'seed', 'steps'})}")
    spec = ToySpec(**spec)
    analyse = None
    if spec.live:
        analyse = _live_analysis(args, seed, spec)
    train_toy(arch, args.out, steps=steps, seed=seed, spec=spec, num_threads=args.threads, analyse=analyse)


def _live_analysis(args, seed: int, spec):
    from anisweep.corpus import read_texts
    from anisweep.extract.model import ExtractSettings
    from anisweep.live.toy import LiveAnalysis
    from anisweep.tangent.settings import GradientSettings

    missing = [f"--{key}" for key in ("name", "texts", "settings") if getattr(args, key) is None]
    if missing:
        raise SystemExit(f"train-toy: a live toy (spec live: true) is analysed as it trains: give {', '.join(missing)}")
    settings = ExtractSettings(**args.settings)
    gradients = GradientSettings(**(args.gradients or {}))
    return LiveAnalysis(args.name, seed, spec.tokens_per_step, read_texts(args.texts), settings, gradients, args.out)


def add_commands(sub) -> None:
    """Add this stage's commands to `anisweep`'s sub-commands."""
    p = sub.add_parser("train-toy", help="train a toy model and save its checkpoints")
    p.add_argument("--spec", type=json_value, required=True, help="JSON: arch, seed, steps and ToySpec fields")
    p.add_argument("--out", required=True)
    p.add_argument("--threads", type=int)
    p.add_argument("--name", help="live toys: the model's name (its rows' `model`)")
    p.add_argument("--texts", help="live toys: the texts written by `anisweep corpus` (the evaluation batch)")
    p.add_argument("--settings", type=json_value, help="live toys: JSON of the config's extract section")
    p.add_argument("--gradients", type=json_value, help="live toys: JSON of the config's gradients section")
    p.set_defaults(run=cmd_train_toy)
