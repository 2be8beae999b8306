"""Only what pyproject.toml cannot say: ship `reskip-lm-eval.pth` at the top of site-packages.

The .pth imports `reskip_lm_eval_hook` at interpreter start, which registers the `reskip`
model name with lm-evaluation-harness (see that module). Everything else is in pyproject.toml.
"""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

PTH = "reskip-lm-eval.pth"


class BuildPyWithPth(build_py):
    def run(self):
        super().run()
        self.copy_file(str(Path("src") / PTH), str(Path(self.build_lib) / PTH))

    def get_outputs(self, include_bytecode=True):
        return super().get_outputs(include_bytecode) + [str(Path(self.build_lib) / PTH)]


setup(cmdclass={"build_py": BuildPyWithPth})
