"""Exception classes: one per kind of mistake, all raised before any buffer state changes.

Every class derives from [`RlbufError`][rlbuf.errors.RlbufError] and from the built-in exception a user would
expect (``ValueError``, ``TypeError`` ...), so ``except ValueError`` keeps working.

Example:
    >>> import torch
    >>> from rlbuf import ReplayBuffer, ShapeError
    >>> buf = ReplayBuffer(10, obs_shape=(3,), action_shape=(1,))
    >>> try:
    ...     buf.add(torch.zeros(4), torch.zeros(1), 1.0, torch.zeros(3), False, truncated=False)
    ... except ShapeError as error:
    ...     print(error)
    obs: expected shape (1, 3) or (3,), got (4,)
    >>> len(buf)
    0
"""

from __future__ import annotations


class RlbufError(Exception):
    """Base class of every error rlbuf raises on purpose."""


class ShapeError(RlbufError, ValueError):
    """A field's shape differs from the one the buffer was built for."""


class DtypeError(RlbufError, TypeError):
    """A field's dtype cannot be stored without losing meaning (e.g. float into uint8)."""


class DeviceError(RlbufError, ValueError):
    """A tensor lives on a device the buffer cannot take it from."""


class NonFiniteError(RlbufError, ValueError):
    """A reward, value or priority is NaN or infinite."""


class OutOfRangeError(RlbufError, ValueError):
    """A value outside the range its field allows (an action outside a discrete action space)."""


class MissingFieldError(RlbufError, KeyError, TypeError):
    """A required field is absent, or an unknown extra field or keyword was given.

    Also a ``TypeError``: Python raises one for a missing or unexpected argument, and a field of
    ``add`` is one.
    """

    def __str__(self) -> str:
        # KeyError quotes its message; ours is a sentence.
        return str(self.args[0]) if self.args else ""


class EmptyBufferError(RlbufError, RuntimeError, ValueError):
    """Sampling or reading from a buffer that holds nothing.

    Also a ``ValueError``, which SB3 and Tianshou ports catch when sampling an empty buffer.
    """


class BatchSizeError(RlbufError, ValueError):
    """A batch size that is not positive, or larger than what is stored."""


class StoredIndexError(RlbufError, IndexError):
    """An index that points outside the stored transitions."""


class PriorityError(RlbufError, ValueError):
    """Priorities of the wrong length, negative, or for a buffer that is not prioritized."""


class BufferFullError(RlbufError, RuntimeError):
    """Adding to a rollout buffer that already holds ``num_steps`` steps."""


class RolloutIncompleteError(RlbufError, RuntimeError):
    """Asking for advantages or minibatches before the rollout is complete."""


class ConfigError(RlbufError, ValueError):
    """Constructor options that contradict each other or the platform."""


class NotPicklableError(ConfigError, TypeError):
    """Pickling or copying a buffer (``pickle``, ``torch.save``, ``copy.deepcopy``): its storage, lock
    and sampler belong to this process. ``buffer.save``/``load`` copy it to disk, ``state_dict`` in
    memory, and ``buffer.torchrl`` is what goes to worker processes.

    Also a ``TypeError``, as Python's own refusal to pickle an object.
    """


class UnsupportedOperationError(RlbufError, TypeError):
    """A Python protocol a buffer or batch does not take (``buffer[0]``, ``for row in buffer``, ``next(buffer)``,
    ``x in buffer``, ``batch["obs"]``, ``np.asarray(batch)``, ``hash(batch)``, ``obs, action = batch``); the message
    names the call to use instead.

    Also a ``TypeError``, as Python's own "object is not subscriptable" or "not iterable".
    """


class StreamError(RlbufError, ValueError):
    """An observation that does not continue its env's stream in a buffer that stores ``next_obs`` once."""


class CheckpointError(RlbufError, ValueError):
    """A checkpoint that is missing, truncated, corrupted, of another version or kind."""


class DatasetError(RlbufError, ValueError):
    """A dataset whose files cannot be read as what they claim to be: missing, truncated or corrupted."""


class RateLimitTimeoutError(RlbufError, TimeoutError):
    """An insert or sample that a rate limiter held longer than its timeout; it changed nothing."""


class ShardDiedError(RlbufError, RuntimeError):
    """A shard of a replay service whose Ray actor died: its rows since the last checkpoint are gone."""


class ReplyError(RlbufError, ValueError):
    """A reply from a replay service's shard that no rlbuf shard sends (corrupted or forged frames): the
    learner refuses the batch, and has allocated no more memory than the batch's own."""


class ReadOnlyError(RlbufError, RuntimeError):
    """A write to a buffer marked ``read_only`` (a dataset, the offline buffer of a ``MixedReplay``); it changed nothing."""


class RlbufWarning(UserWarning):
    """Base class of every warning rlbuf gives about a likely mistake; make them errors with
    ``warnings.simplefilter("error", rlbuf.RlbufWarning)``."""


class NextStepResetWarning(RlbufWarning):
    """An ``add`` that looks like the reset step of gymnasium's ``NEXT_STEP`` autoreset: the env's
    previous stored row ended an episode and its ``obs`` is that row's ``next_obs`` (a final
    observation followed by a reset one, which is no transition of the env). Also given, with its
    own message, when at every episode end so far (three at least) such an ``obs`` came with a reward
    or a flag: then those rows stored the reset observation as their ``next_obs``, as ``SAME_STEP``
    gives it without ``info["final_obs"]``. From ``RolloutBuffer.add``, which stores no ``next_obs``:
    every episode end so far (three at least) was followed in its env by a step with reward 0 and no
    flag, while fewer than half of the other steps had reward 0 (see ``rlbuf/_rollout_resets.py``)."""


class BatchedSpaceWarning(RlbufWarning):
    """A buffer built from a vector env's batched space (``envs.observation_space``), whose first
    dim is ``num_envs``, instead of ``envs.single_observation_space``."""


class MemoryWarning(RlbufWarning):
    """An option that stores more bytes than needed (a float64 observation space without ``obs_dtype``)."""
