"""ExecuTorch's LLM export (`export_llm`) of a Llama checkpoint, run in a subprocess.

Export time only: the subprocess needs torch and executorch, this module imports neither. One
recipe for examples/export_smollm2.py, the bench's tiny models and the tests' Llama exports.
"""

import os
import sys
import textwrap

# The CLI entry point, plus saving the pre-lowering ExportedProgram (the program that is then
# lowered, so it is a like-for-like eager reference) when a path other than "-" is given.
DRIVER = textwrap.dedent(
    """
    import sys, torch
    from executorch.extension.llm.export import builder

    _pt2 = sys.argv.pop(1)
    if _pt2 not in ("", "-"):
        _orig = builder.LLMEdgeManager._export

        def _export(self, module=None):
            ep = _orig(self, module)
            if module is None:
                torch.export.save(ep, _pt2)
            return ep

        builder.LLMEdgeManager._export = _export
    from executorch.extension.llm.export.export_llm import main

    sys.argv[0] = "export_llm"
    main()
    """
)


def export_llm_args(params_path, ckpt_path, out_dir, pte_name, max_len, *, qmode=None, group_size=32,
                    backend="vulkan", dynamic=True):
    """The `export_llm` overrides: Llama 3 with the KV cache and sdpa_with_kv_cache, fp32."""
    args = [
        f"base.params={params_path}",
        f"base.checkpoint={ckpt_path}",
        "base.model_class=llama3",
        "model.use_kv_cache=true",
        "model.use_sdpa_with_kv_cache=true",
        f"model.enable_dynamic_shape={'true' if dynamic else 'false'}",
        f"backend.{backend}.enabled=true",
        f"export.max_seq_length={max_len}",
        f"export.max_context_length={max_len}",
        "model.dtype_override=fp32",
        f"export.output_dir={out_dir}",
        f"export.output_name={os.path.join(out_dir, pte_name)}",
    ]
    if qmode in ("4w", "8da4w"):
        args += [f"quantization.qmode={qmode}", f"quantization.group_size={group_size}"]
    elif qmode is not None:
        raise ValueError(f"qmode {qmode!r}: expected None, '4w' or '8da4w'")
    return args


def export_command(overrides, pt2_path="-"):
    """The subprocess command line; `pt2_path` also keeps the ExportedProgram there."""
    return [sys.executable, "-u", "-c", DRIVER, pt2_path or "-", *overrides]
