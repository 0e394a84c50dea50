"""Where tests find the project, its test data and the reference data beside the checkout."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TEST_DATA = ROOT / "tests" / "data"
HF_CONFIGS = TEST_DATA / "hf"
# Real published material (logs, launch scripts, HF configs) read in place, never copied.
SHARED_DATA = ROOT.parent / "shared" / "data"
