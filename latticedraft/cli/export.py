"""``latticedraft export <verb>``: write what latticedraft trained in the layouts other tools read
(``export medusa``: Medusa heads in vLLM's layout; ``export custom-generate``: a directory
transformers' ``generate(custom_generate=DIR, trust_remote_code=True)`` runs latticedraft from)."""

from __future__ import annotations

from latticedraft.cli.args import DTYPES


def _cmd_export_medusa(a) -> int:
    from latticedraft.gpu.models.medusa_io import export_medusa

    r = export_medusa(a.model, a.out, dtype=a.dtype, force=a.force)
    print(f"exported {r.num_heads} Medusa heads ({r.num_layers} residual block{'s' if r.num_layers != 1 else ''} each, "
          f"{'own LM heads' if r.lm_head == 'heads' else 'original_lm_head'}, {r.dtype}) in vLLM's layout to {r.out_dir}")
    return 0


def _cmd_export_custom_generate(a) -> int:
    from latticedraft.decoding.custom_generate.export import export_custom_generate

    out = export_custom_generate(a.out, force=a.force)
    print(f"wrote {out}: model.generate(input_ids, custom_generate={str(out)!r}, trust_remote_code=True, "
          "max_new_tokens=64) decodes with latticedraft (keywords heads=DIR, drafter=..., lm=DIR)")
    return 0


def add_parser(groups) -> None:
    from latticedraft.cli.output_options import out_dir
    from latticedraft.outputs import CUSTOM_GENERATE, MEDUSA_EXPORT

    grp = groups.add_parser("export", help="write heads for vLLM, or a directory transformers' generate runs",
                            description="Write what latticedraft trained in the layouts other tools read.")
    verbs = grp.add_subparsers(dest="verb", required=True, metavar="<verb>")
    p = verbs.add_parser("medusa", help="Medusa heads as vLLM reads them (config.json + model.safetensors)",
                         description="Write the Medusa heads of a head directory (train heads --kind medusa, or import "
                                     "medusa) in vLLM's layout: config.json (model_type medusa) and model.safetensors "
                                     "(blocks.I.layers.L.weight, lm_heads.I.weight). Serve with vLLM's "
                                     "speculative_config={\"method\": \"medusa\", \"model\": OUT}. Stern and DynaMo "
                                     "heads are refused: the layout cannot express them.")
    p.add_argument("--model", required=True, metavar="DIR", help="head directory holding Medusa heads (heads_config.json)")
    out_dir(p, MEDUSA_EXPORT, inputs=("model",), required=True,
            help="output directory (config.json, model.safetensors, medusa_export.json; not --model)")
    p.add_argument("--force", action="store_true", help="replace an earlier `export medusa` output in --out")
    p.add_argument("--dtype", default=None, choices=DTYPES,
                   help="dtype of the written weights (default: the dtype the heads are stored in)")
    p.set_defaults(func=_cmd_export_medusa)
    p = verbs.add_parser("custom-generate", help="a directory transformers' generate(custom_generate=DIR) runs "
                                                 "latticedraft from",
                         description="Write a directory usable as model.generate(..., custom_generate=DIR, "
                                     "trust_remote_code=True): custom_generate/generate.py runs latticedraft's decode "
                                     "loop (BPD) on the model it is given, with the generation config's "
                                     "max_new_tokens, do_sample, temperature, top_k, top_p and eos_token_id and the "
                                     "keywords heads=DIR (default: the bundled heads on the bundled base), drafter=, "
                                     "lm=DIR; greedy output equals generate(do_sample=False).")
    out_dir(p, CUSTOM_GENERATE, required=True,
            help="output directory (custom_generate/generate.py, requirements.txt, README.md)")
    p.add_argument("--force", action="store_true", help="replace an earlier custom-generate export in --out")
    p.set_defaults(func=_cmd_export_custom_generate)
