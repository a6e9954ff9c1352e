"""The storage package's public names."""

from __future__ import annotations

import pipeline.storage
from pipeline.storage import inspect


def test_verify_report_is_exported_beside_verify_store():
    """``VerifyReport`` (what ``verify_store`` returns) is importable from the package."""
    from pipeline.storage import VerifyReport

    assert VerifyReport is inspect.VerifyReport
    assert "VerifyReport" in pipeline.storage.__all__ and "VerifyReport" in dir(pipeline.storage)
    assert pipeline.storage.__all__ == sorted(pipeline.storage.__all__)
