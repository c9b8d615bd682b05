"""The reset steps of gymnasium's ``NEXT_STEP`` autoreset, recognised at ``RolloutBuffer.add``.

With ``NEXT_STEP`` (``gym.make_vec``'s default), the step after an episode's end resets the env: it
returns the reset observation with reward 0 and both flags False, for an action the env ignored. A
loop that adds every step to a rollout (CleanRL's ``ppo.py``) stores it as a transition, and GAE and
the loss take it in. A rollout stores no ``next_obs``, so the only trace of such a step is that its
env's previous stored step ended an episode and it has reward exactly 0 and no flag, which is also
an ordinary first step in a sparse-reward env (Atari, MiniGrid). So
[`RolloutResets`][rlbuf._rollout_resets.RolloutResets] warns
([`NextStepResetWarning`][rlbuf.errors.NextStepResetWarning]) only when the trace is systematic and
stands out, counted over the buffer's life (across ``clear``, so over many rollouts):

- at least ``_SYSTEMATIC`` (3) episode ends were followed, in their env, by a stored step;
- every one of those steps had reward exactly 0 and no flag;
- fewer than half of the other stored steps (env rows) had reward exactly 0.

It warns before anything is stored, once per buffer, and then stops watching; a warning made an
error by a filter leaves the buffer as it was. A step follows an end only within one run of adds:
``clear`` (and so a load) and ``extend`` forget each env's previous step, as do rows set in place through
``buffer.torchrl``; a [`Recorder`][rlbuf.gym.Recorder] turns the watch off (it stores no reset step).
One step after an end with a reward or a flag ends the watch too: these envs reset in the same step; so do
``_LAST_END`` (100) quiet ends without the rule holding (a sparse-reward env).

Example:
    >>> import warnings
    >>> import numpy as np
    >>> from rlbuf import NextStepResetWarning, RolloutBuffer
    >>> buf = RolloutBuffer(9, 1, obs_shape=(1,), action_shape=())
    >>> def add(reward, terminated):
    ...     buf.add(np.zeros((1, 1)), [0.0], [reward], [terminated], [0.0], [0.0], truncated=False)
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     for _ in range(3):   # a step, an episode's end, then NEXT_STEP's reset step
    ...         add(1.0, False); add(1.0, True); add(0.0, False)
    >>> [type(warning.message).__name__ for warning in caught]
    ['NextStepResetWarning']
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from rlbuf._autoreset import _SYSTEMATIC, _warn_first
from rlbuf._ring import RowRing

_LAST_END = 100
"""Episode ends followed by a quiet step after which a rule that has not held stops being checked (a sparse-reward
env with SAME_STEP autoreset: its first steps pay 0 as often as the others)."""


class RolloutResets:
    """Watches a rollout's adds for ``NEXT_STEP`` reset steps, and writes them (see the module).

    Args:
        ring: the rollout's ring; ``add`` reads and writes its rows as ``ring.add`` does.
        num_envs: rows per add.

    Example:
        >>> from rlbuf import RolloutBuffer
        >>> buf = RolloutBuffer(2, 2, obs_shape=(1,), action_shape=())
        >>> resets = RolloutResets(buf._ring, 2)
        >>> resets.watching, resets.ends
        (True, 0)
    """

    def __init__(self, ring: RowRing, num_envs: int) -> None:
        self._ring = ring
        names = [spec.name for spec in ring.input_specs]
        self._at = tuple(names.index(name) for name in ("reward", "terminated", "truncated"))
        self.watching = True
        self._ended: np.ndarray[Any, Any] = np.zeros(num_envs, np.bool_)  # the env's step stored last ended an episode
        self._followed = 0  # how many envs did so, if that step is the ring's newest (0: nothing to follow)
        # Where the rows stood after this watch's last add: moved by loads, rewrites and rows set in place or written
        # through buffer.torchrl, after which the previous step is no longer the ring's newest.
        self._written = (ring.generation, ring.write_count)
        # Episode ends followed in their env by a stored step (each one quiet: reward 0, no flag, or the watch
        # ended), and the other stored steps (env rows), with how many of them had reward exactly 0.
        self.ends = self.others = self.other_zeros = 0

    def forget(self) -> None:
        """Forget each env's previous step (the rollout was cleared, loaded or extended); the counts stay."""
        self._followed = 0

    def stop(self) -> None:
        """Stop watching (a [`Recorder`][rlbuf.gym.Recorder] feeds the buffer)."""
        self.watching = False

    def add(self, values: Sequence[Any], rows: int) -> None:
        """Store one step, as ``ring.add(values, rows)``, after warning if it holds a reset step (see the module).

        Raises:
            ShapeError, DtypeError, DeviceError, NonFiniteError: a field's reader refused it.
            NextStepResetWarning: where a warnings filter makes it an error; nothing is stored.
        """
        ring = self._ring
        if not self.watching:
            ring.add(values, rows)
            return
        with ring.lock:
            arrays = ring.read_staged(values, rows)
            if arrays is None:  # tensors on the storing device, or more rows than the stage holds
                columns = ring.read_tensors(ring.input_specs, values, rows)
                step = [columns[ring.input_specs[at].name].cpu().numpy().reshape(-1) for at in self._at]
            else:
                step = [arrays[at] if rows > 1 else np.asarray(arrays[at]).reshape(1) for at in self._at]
            counts, ended, watching = self._check(*step)
            followed = 0 if ended is None else int(np.count_nonzero(ended))
            if arrays is None:
                ring.write_checked(columns, rows)
            else:
                ring.write_staged(arrays, rows)
            self.ends, self.others, self.other_zeros = counts
            if ended is not None:
                self._ended = ended
            self._followed, self._written = followed, (ring.generation, ring.write_count)
            self.watching = watching

    def _check(self, reward: np.ndarray[Any, Any], terminated: np.ndarray[Any, Any], truncated: np.ndarray[Any, Any],
               ) -> tuple[tuple[int, int, int], np.ndarray[Any, Any] | None, bool]:
        """The counts with this step ``[num_envs]``, its episode ends (``None``: none), and whether to watch on;
        warns if the rule holds. Numpy's cost per call dominates: three where no env ended a step before."""
        ended = terminated | truncated if np.count_nonzero(terminated) or np.count_nonzero(truncated) else None
        zeros = reward.size - int(np.count_nonzero(reward))
        followed = self._followed if self._written == (self._ring.generation, self._ring.write_count) else 0
        if not followed:
            return (self.ends, self.others + reward.size, self.other_zeros + zeros), ended, True
        after = self._ended
        if np.count_nonzero(reward[after]) or (ended is not None and np.count_nonzero(ended[after])):
            return (self.ends, self.others, self.other_zeros), ended, False  # an env that reset in the same step
        ends, others, other_zeros = self.ends + followed, self.others + reward.size - followed, self.other_zeros + zeros - followed
        if ends >= _SYSTEMATIC and 2 * other_zeros < others and _warn_first(after, lambda env: (
                f"add: env {env}'s step follows the end of its episode in its previous step, with reward 0 and no "
                f"flag, as at every one of the {ends} episode ends so far in this buffer (and {other_zeros} of its "
                f"{others} other steps have reward 0): these are the reset steps of gymnasium's NEXT_STEP "
                f"autoreset (make_vec's default), a final observation followed by a reset one with the action "
                f"ignored, which are no transitions of the env; in a rollout they enter GAE and the loss. Build the "
                f"envs with SAME_STEP autoreset (gymnasium.make_vec(env_id, num_envs, vectorization_mode='sync', "
                f"vector_kwargs={{'autoreset_mode': gymnasium.vector.AutoresetMode.SAME_STEP}})) and collect with "
                f"rlbuf.gym.Recorder(envs, rollout, bootstrap=...), which stores exactly the real steps. (An env "
                f"whose first step after a reset always pays exactly 0 looks the same: silence this warning there "
                f"with warnings.filterwarnings('ignore', category=rlbuf.NextStepResetWarning).) Warned once per "
                f"buffer")):
            return (ends, others, other_zeros), ended, False
        return (ends, others, other_zeros), ended, ends < _LAST_END  # the rule has had its evidence
