"""The `export_llm` subprocess (see `async_runtime.llm.export.export_command`): ExecuTorch's LLM
export CLI with three additions.

- ExecuTorch's Vulkan fusion patterns are built once (`async_runtime.vulkan_patterns`), not again
  for every partition.
- Each stage prints a `STAGE_MARK` line as it starts, so the parent can show where the export is
  (ExecuTorch logs nothing for minutes while it lowers).
- With a path other than "-", the pre-lowering ExportedProgram (the program that is then lowered,
  so a like-for-like eager reference) is saved there.

Export time only: imports torch and ExecuTorch.
"""

import sys

STAGE_MARK = "@@pte-wgpu stage: "
# (LLMEdgeManager method, the stage it starts), in the order the export runs them
STAGES = (
    ("export", "torch.export"),
    ("pt2e_quantize", "quantizing"),
    ("export_to_edge", "to edge dialect"),
    ("to_backend", "partitioning for Vulkan"),
    ("to_executorch", "to ExecuTorch program, memory planning"),
    ("save_to_pte", "saving"),
)
PREPROCESS_STAGE = "lowering partition {} to Vulkan"


def announce(stage):
    print(f"{STAGE_MARK}{stage}", flush=True)


def _announcing(method, stage):
    def wrapped(*args, **kwargs):
        announce(stage)
        return method(*args, **kwargs)

    return wrapped


def _save_program_to(builder, pt2_path):
    import torch

    original = builder.LLMEdgeManager._export

    def _export(self, module=None):
        ep = original(self, module)
        if module is None:
            torch.export.save(ep, pt2_path)
        return ep

    builder.LLMEdgeManager._export = _export


def _announce_preprocess():
    from executorch.backends.vulkan.vulkan_preprocess import VulkanBackend

    preprocess, count = VulkanBackend.preprocess.__func__, [0]

    def counted(cls, program, compile_specs):
        count[0] += 1
        announce(PREPROCESS_STAGE.format(count[0]))
        return preprocess(cls, program, compile_specs)

    VulkanBackend.preprocess = classmethod(counted)


def main(argv):
    """argv: [pt2 path or "-", export_llm overrides...]"""
    from executorch.extension.llm.export import builder
    from executorch.extension.llm.export.export_llm import main as export_llm

    from ..vulkan_patterns import cache_vulkan_pattern_graphs

    cache_vulkan_pattern_graphs()
    pt2_path, overrides = argv[0], argv[1:]
    if pt2_path not in ("", "-"):
        _save_program_to(builder, pt2_path)
    for name, stage in STAGES:
        setattr(builder.LLMEdgeManager, name, _announcing(getattr(builder.LLMEdgeManager, name), stage))
    _announce_preprocess()
    sys.argv = ["export_llm", *overrides]
    export_llm()
