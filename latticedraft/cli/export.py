"""``latticedraft export <verb>``: write what latticedraft trained in the layouts other tools read
(``export medusa``: Medusa heads in vLLM's layout)."""

from __future__ import annotations


def _cmd_export_medusa(a) -> int:
    from latticedraft.gpu.models.medusa_io import export_medusa
    from latticedraft.paths import check_writable

    check_writable(a.out, "--out", "directory")
    r = export_medusa(a.model, a.out, dtype=a.dtype)
    print(f"exported {r.num_heads} Medusa heads ({r.num_layers} residual block{'s' if r.num_layers != 1 else ''} each, "
          f"{'own LM heads' if r.lm_head == 'heads' else 'original_lm_head'}, {r.dtype}) in vLLM's layout to {r.out_dir}")
    return 0


def add_parser(groups) -> None:
    grp = groups.add_parser("export", help="write trained heads in the layouts serving engines read",
                            description="Write what latticedraft trained in the layouts other tools read.")
    verbs = grp.add_subparsers(dest="verb", required=True, metavar="<verb>")
    p = verbs.add_parser("medusa", help="Medusa heads as vLLM reads them (config.json + model.safetensors)",
                         description="Write the Medusa heads of a head directory (train heads --kind medusa, or import "
                                     "medusa) in vLLM's layout: config.json (model_type medusa) and model.safetensors "
                                     "(blocks.I.layers.L.weight, lm_heads.I.weight). Serve with vLLM's "
                                     "speculative_config={\"method\": \"medusa\", \"model\": OUT}. Stern and DynaMo "
                                     "heads are refused: the layout cannot express them.")
    p.add_argument("--model", required=True, metavar="DIR", help="head directory holding Medusa heads (heads_config.json)")
    p.add_argument("-o", "--out", required=True, metavar="OUT", help="output directory (config.json, model.safetensors)")
    p.add_argument("--dtype", default=None, choices=["float32", "float16", "bfloat16"],
                   help="dtype of the written weights (default: the dtype the heads are stored in)")
    p.set_defaults(func=_cmd_export_medusa)
