"""The names ``replay.py``, ``rollout.py``, ``distill.py`` and ``_obs.py`` import from here until
they import them from [`rlbuf._buffer`][rlbuf._buffer], [`rlbuf._fields`][rlbuf._fields] and
[`rlbuf._state`][rlbuf._state] (issue 20: this module then goes)."""

from rlbuf._buffer import FOREIGN_OPTIONS, RingBuffer, done_of, refuse_foreign_options
from rlbuf._core import deliver
from rlbuf._fields import BATCH_NAMES, extra_specs
from rlbuf._obs import as_shape
from rlbuf._state import MetadataOnlyWarning
from rlbuf._state import option_to_json as _option_to_json
from rlbuf.storage import build_storage

__all__ = ["BATCH_NAMES", "FOREIGN_OPTIONS", "MetadataOnlyWarning", "RingBuffer", "_option_to_json", "as_shape",
           "build_storage", "deliver", "done_of", "extra_specs", "refuse_foreign_options"]
