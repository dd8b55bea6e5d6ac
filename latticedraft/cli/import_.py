"""``latticedraft import <verb>``: read what was made elsewhere (``import medusa``: vLLM's or
FasterDecoding's Medusa checkpoints into a head directory; ``import gguf``: a llama.cpp GGUF model
into a float32 HF model directory). ``import`` is a Python keyword, hence the module's name."""

from __future__ import annotations


def _cmd_import_medusa(a) -> int:
    from latticedraft.gpu.models.medusa_io import import_medusa

    r = import_medusa(a.src, a.base, a.out, force=a.force)
    print(f"imported {r.num_heads} Medusa heads ({r.layout} layout, {r.num_layers} residual "
          f"block{'s' if r.num_layers != 1 else ''} each, {'own LM heads' if r.lm_head == 'heads' else 'tied LM head'}, "
          f"{r.dtype}) to {r.out_dir}; decode with --model {r.out_dir}")
    return 0


def _cmd_import_gguf(a) -> int:
    from latticedraft.gpu.models.gguf_import import count_text, import_gguf

    r = import_gguf(a.src, a.out, force=a.force)
    print(f"imported {r.source.name}: {count_text(r.parameters)} parameters ({r.model_type}, {r.dtype}) to "
          f"{r.out_dir} in {r.seconds:.1f} s; decode with --model {r.out_dir}")
    return 0


def add_parser(groups) -> None:
    from latticedraft.cli.output_options import out_dir
    from latticedraft.outputs import GGUF_IMPORT, MEDUSA_IMPORT

    grp = groups.add_parser("import", help="read what was made elsewhere (Medusa checkpoints, GGUF models)",
                            description="Read heads trained elsewhere into a latticedraft head directory that every "
                                        "drafter decodes with, or a GGUF model into an HF model directory.")
    verbs = grp.add_subparsers(dest="verb", required=True, metavar="<verb>")
    p = verbs.add_parser("medusa", help="Medusa heads in vLLM's or FasterDecoding's layout",
                         description="Read Medusa heads (vLLM's layout: config.json + blocks.I.layers.L.weight, "
                                     "lm_heads.I.weight; FasterDecoding's: medusa_head.I.L.linear.weight in "
                                     "medusa_lm_head.pt or .safetensors) for the base model BASE and write a head "
                                     "directory: N Medusa heads become heads 2..N+1 beside the base's own head 1.")
    p.add_argument("src", metavar="SRC", help="Medusa checkpoint directory (config.json and the weights)")
    p.add_argument("--base", required=True, metavar="BASE", help="the base model directory (HF format) the heads were "
                                                                 "trained on")
    out_dir(p, MEDUSA_IMPORT, inputs=("src", "base"), required=True,
            help="output head directory (heads_config.json names BASE relatively; not SRC or BASE)")
    p.add_argument("--force", action="store_true", help="replace an earlier `import medusa` output in --out")
    p.set_defaults(func=_cmd_import_medusa)
    p = verbs.add_parser("gguf", help="a llama.cpp GGUF model (quantized or not) as a float32 HF model directory",
                         description="Read a GGUF file with transformers (any architecture it can dequantize: llama, "
                                     "mistral, qwen2, gemma, phi3, ...) and write a float32 HF model directory: "
                                     "config.json, generation_config.json (the file's end-of-text id), "
                                     "model.safetensors, tokenizer.json and the chat template, and gguf_import.json "
                                     "(source sha256, architecture, parameter count).")
    p.add_argument("src", metavar="FILE", help="the .gguf file")
    out_dir(p, GGUF_IMPORT, inputs=("src",), required=True, help="output model directory (not FILE's own directory)")
    p.add_argument("--force", action="store_true", help="replace an earlier `import gguf` output in --out")
    p.set_defaults(func=_cmd_import_gguf)
