"""The bundled sample environment: 40 MuSiQue questions with their paragraphs (CC BY 4.0, see NOTICE).

It ships without its BM25 index (``env.load`` rebuilds it in memory in milliseconds). Developers rebuild it
from the MuSiQue data with ``python3 scripts/build_sample.py --src ../shared/data/musique``.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from branchgate.errors import BranchgateError

SAMPLE_QUERIES = 40
SAMPLE_DIR = Path(str(files("branchgate.data") / "samples" / "musique_sample"))
ATTRIBUTION = (
    "MuSiQue (Trivedi et al., 2022, https://github.com/StonyBrookNLP/musique), CC BY 4.0; "
    "subset as distributed in OSU-NLP-Group/HippoRAG. Questions, decompositions and paragraphs unchanged."
)


HOTPOTQA_DIR = Path(str(files("branchgate.data") / "samples" / "hotpotqa_sample"))
HOTPOTQA_ATTRIBUTION = (
    "HotpotQA (Yang et al., 2018, https://hotpotqa.github.io), CC BY-SA 4.0; subset as distributed in "
    "OSU-NLP-Group/HippoRAG. Questions and paragraphs unchanged; key points = the supporting facts' sentences."
)


def sample_path() -> Path:
    if not (SAMPLE_DIR / "manifest.json").exists():
        raise BranchgateError(
            f"the bundled sample environment is missing ({SAMPLE_DIR}); reinstall branchgate or "
            "rebuild it with `python3 scripts/build_sample.py --src DIR`"
        )
    return SAMPLE_DIR
