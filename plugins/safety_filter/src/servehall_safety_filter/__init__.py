"""servehall-safety-filter: input and streamed-output content filtering.

Detectors (keyword/phrase lists, regular expressions, built-in PII detectors and
detectors contributed by other distributions through :class:`Detector`) run on text
normalised with NFKC + case folding, with zero-width/format characters removed and
whitespace runs collapsed; an offset map leads every match back to the original text so
redaction edits the right characters. Rules are grouped into named policies chosen per
tenant. See ``docs/safety_filter.md``.
"""

from servehall_safety_filter.detectors import DETECTOR_ENTRY_POINT_GROUP, Detector
from servehall_safety_filter.settings import PolicySettings, RuleSettings, SafetyFilterSettings

__all__ = [
    "DETECTOR_ENTRY_POINT_GROUP",
    "Detector",
    "PolicySettings",
    "RuleSettings",
    "SafetyFilterSettings",
]
