"""Two envs whose every frame carries its id, the check that a sampled row is the transition its ids say,
and the dict-observation compact buffer the attacks on it use (``tests/test_attack_compact_*.py``).
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict

from rlbuf import ReplayBuffer

IMAGE = (6, 5)


def _ends(env: int, frame_id: int) -> bool:
    """Env 0 terminates after frames 6, 13, 20 ...; env 1 is truncated after frames 4, 9, 14 ..."""
    return frame_id % 7 == 6 if env == 0 else frame_id % 5 == 4


def _reward(frame_id: int) -> float:
    return float(frame_id % 8) - 3.5


class IdEnvs:
    """Two envs whose every frame carries its id (per env, counting resets): the image ``(2 * id + env) % 256``,
    the state ``[id, env, the episode's first id]``; ends and rewards follow from the ids."""

    def __init__(self, k: int) -> None:
        self.k = k
        self.ids = [0, 0]
        self.first = [0, 0]

    def _stack(self, env: int, newest: int) -> dict[str, np.ndarray[Any, Any]]:
        ids = [max(newest - (self.k - 1 - j), self.first[env]) for j in range(self.k)]
        return {"image": np.stack([np.full(IMAGE, (2 * i + env) % 256, np.uint8) for i in ids]),
                "state": np.array([[i, env, self.first[env]] for i in ids], np.float32)}

    def step(self, keep: tuple[bool, bool] = (True, True)) -> tuple[Any, ...]:
        """One step of both envs; an env not in ``keep`` gives a junk row (for ``env_mask``) and does not advance."""
        obs, next_obs, reward, terminated, truncated = [], [], [], [], []
        for env in range(2):
            newest = self.ids[env]
            if not keep[env]:
                junk = self._stack(env, newest)
                obs.append(junk)
                next_obs.append(junk)
                reward.append(0.0)
                terminated.append(False)
                truncated.append(False)
                continue
            obs.append(self._stack(env, newest))
            next_obs.append(self._stack(env, newest + 1))
            reward.append(_reward(newest))
            end = _ends(env, newest)
            terminated.append(end and env == 0)
            truncated.append(end and env == 1)
            self.ids[env] = newest + 1
            if end:  # a reset: a new first frame
                self.ids[env] = self.first[env] = newest + 2
        return ({key: np.stack([o[key] for o in obs]) for key in ("image", "state")}, np.zeros(2, np.float32),
                np.array(reward, np.float32), {key: np.stack([o[key] for o in next_obs]) for key in ("image", "state")},
                np.array(terminated), np.array(truncated))


def check_id_batch(batch: Any, k: int, n: int, gamma: float) -> None:
    """Every sampled row is the transition its ids say, whole: stacks, next stacks, reward, flags, discount."""
    state, after = batch.obs["state"].numpy(), batch.next_obs["state"].numpy()
    image, next_image = batch.obs["image"].numpy(), batch.next_obs["image"].numpy()
    for row in range(len(state)):
        newest, env, first = (int(v) for v in state[row, -1])
        m = next((i for i in range(1, n + 1) if _ends(env, newest + i - 1)), n)
        ended = _ends(env, newest + m - 1)
        for stack, pixels, top in ((state[row], image[row], newest), (after[row], next_image[row], newest + m)):
            ids = [max(top - (k - 1 - j), first) for j in range(k)]
            assert stack.tolist() == [[i, env, first] for i in ids], (row, stack.tolist(), ids)
            assert [int(p[0, 0]) for p in pixels] == [(2 * i + env) % 256 for i in ids], row
            assert (pixels == pixels[:, :1, :1]).all(), row
        total = 0.0
        for i in range(m):
            total += float(np.float32(_reward(newest + i))) * gamma**i
        assert np.float32(batch.reward[row].item()) == np.float32(total), row
        assert bool(batch.terminated[row]) == (ended and env == 0)
        assert bool(batch.truncated[row]) == (ended and env == 1)
        assert np.float32(batch.discount[row].item()) == np.float32(0.0 if ended and env == 0 else gamma**m)


def _dict_buffer(compression: str | None = None, n_step: int = 2, **options: Any) -> ReplayBuffer:
    return ReplayBuffer(24, obs_shape={"image": (3, *IMAGE), "state": (3, 3)}, obs_dtype={"image": torch.uint8},
                        action_shape=(), num_envs=2, frame_stack=3, n_step=n_step, gamma=0.5, compression=compression,
                        seed=0, **options)


def _broken(step: tuple[Any, ...], part: int, change: Any) -> tuple[Any, ...]:
    """``step`` with its part ``part`` (0: obs ... 5: truncated) replaced by ``change(copy of it)``."""
    parts = list(copy.deepcopy(step))
    parts[part] = change(parts[part])
    return tuple(parts)


def _with(key: str, value: Any) -> Any:
    return lambda obs: {**obs, key: value(obs[key]) if callable(value) else value}


def _without(key: str) -> Any:
    return lambda obs: {name: v for name, v in obs.items() if name != key}


def _collected(envs: IdEnvs, steps: int, nested: bool) -> TensorDict:
    """``steps`` steps as a collector's ``[num_envs, T]`` TensorDict."""
    parts = [envs.step() for _ in range(steps)]

    def stacked(part: int, key: str | None = None) -> torch.Tensor:
        return torch.from_numpy(np.stack([p[part] if key is None else p[part][key] for p in parts], 1))
    where = ("observation",) if nested else ()
    td = TensorDict({}, batch_size=[2, steps])
    for key in ("image", "state"):
        td[(*where, key)] = stacked(0, key)
        td[("next", *where, key)] = stacked(3, key)
    td["action"] = stacked(1)
    td["next", "reward"] = stacked(2)
    td["next", "terminated"] = stacked(4)
    td["next", "truncated"] = stacked(5)
    return td
