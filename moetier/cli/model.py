"""CLI verb ``model import``: a model record from a model directory, so a model can be simulated before its bytes
are packed (and packed from an EXL3 checkpoint with ``store pack --checkpoint``).

Contract: same as moetier.cli (one-line errors, exit 2). The record is validated against the model schema and
written atomically to the registry (``--out FILE`` writes it there instead); an existing record id is kept unless
``--force``.
"""
from __future__ import annotations

import sys

from moetier.cli.common import positive_float
from moetier.cli.outpath import file_arg
from moetier.errors import UserError


def register(sub, parser_class) -> None:
    sp = sub.add_parser("model", help="model records: import one from a model directory")
    msub = sp.add_subparsers(dest="model_cmd", parser_class=parser_class)
    p = msub.add_parser("import", help="write a model record from config.json (and an EXL3 checkpoint's tensors)")
    p.add_argument("dir", help="model directory (config.json; for EXL3 also quantization_config.json, *.safetensors)"
                   " or a config.json file")
    p.add_argument("--bits", type=positive_float, help="bits per expert weight (default: the quantization config)")
    p.add_argument("--id", help="record id (default: from the directory name)")
    p.add_argument("--out", type=file_arg("--out"), help="write the record to this file instead of the registry")
    p.add_argument("--force", action="store_true", help="replace an existing registry record of the same id")
    p.add_argument("--json", action="store_true", help="print the record")
    sp.set_defaults(fn=cmd_model)


def cmd_model(args) -> int:
    from moetier.bytes import model_import
    from moetier.core import records as spec
    if args.model_cmd != "import":
        raise UserError("model: expected a subcommand: import")
    if args.id is not None and not args.out:        # before reading the checkpoint: the id can be written
        spec.check_writable("model", args.id, force=args.force, overlay=args.force)
    rec = model_import.import_model(args.dir, bits=args.bits, rid=args.id)
    from pathlib import Path
    config = Path(args.dir) / "config.json" if Path(args.dir).is_dir() else Path(args.dir)
    spec.validate("model", rec, f"{config} (the model record made from it)")   # the input named, not the output
    if args.out:
        from moetier import strictjson
        from moetier.atomic import atomic_write
        text = strictjson.dumps(rec, indent=2) + "\n"     # standard JSON: never a bare NaN or Infinity
        where = atomic_write(Path(args.out), lambda f: f.write(text.encode("utf-8")))
    else:
        if rec["id"] in spec.record_ids("model") and not args.force:
            raise UserError(f"model id {rec['id']!r} already in the registry; pass --id NAME or --force")
        where = spec.write_record("model", rec, force=args.force, overlay=args.force)
    if args.json:
        from moetier.cli.common import _emit
        _emit(rec)
    m, st = rec["moe"], rec["store"]
    what = f"model {rec['id']}: {where}" if not args.out else where
    print(f"wrote {what}: {m['layers']} MoE layers x {m['experts']} experts (top-{m['topk']}, {m['shared']} shared), "
          f"{rec['geometry']['hidden']} x {rec['geometry']['intermediate']} at {rec['geometry']['bits']:g} bits: "
          f"{m['expert_bytes']:,} B per expert, {st['record_bytes']:,} B per record"
          f"{', ' + st['encoding'] if 'encoding' in st else ' (simulate only)'}", file=sys.stderr if args.json else
          sys.stdout)
    return 0
