"""Progress of long work: a tqdm bar in a terminal, a line with the time left in a log file or pipe.

tqdm redraws one line with carriage returns, which a log file keeps as one unreadable line; so where
stderr is not a terminal, `Progress` prints a plain line (done/total, rate, elapsed, time left) at most
every `every_s` seconds, and always at the end."""

from __future__ import annotations

import sys
import time

from tqdm.auto import tqdm


def _clock(seconds: float) -> str:
    seconds = int(round(seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


class Progress:
    """update(n, **postfix) after each unit of work; close() at the end. enabled=False: silent."""

    def __init__(self, total: int, desc: str, unit: str = "step", initial: int = 0, enabled: bool = True,
                 every_s: float = 10.0, stream=None):
        self.total, self.desc, self.unit, self.done = total, desc, unit, initial
        self.enabled, self.every_s = enabled, every_s
        self.stream = stream or sys.stderr
        self.start_done, self.t0 = initial, time.monotonic()
        self.last_line = self.t0
        self.aside, self.aside_left = 0.0, 0.0  # seconds of other work done between units, and still to come
        interactive = enabled and hasattr(self.stream, "isatty") and self.stream.isatty()
        self.bar = tqdm(total=total, initial=initial, desc=desc, unit=unit, file=self.stream) if interactive else None

    def update(self, n: int = 1, **postfix) -> None:
        self.done += n
        if not self.enabled:
            return
        if self.bar is not None:
            if postfix:
                self.bar.set_postfix(**postfix, refresh=False)
            self.bar.update(n)
            return
        now = time.monotonic()
        if now - self.last_line >= self.every_s or self.done >= self.total:
            self.last_line = now
            self.stream.write(self.line(now, postfix) + "\n")
            self.stream.flush()

    def set_aside(self, spent_s: float, left_s: float) -> None:
        """Other work done between units (training's validations): `spent_s` more seconds of it, kept out of the
        rate per unit, and `left_s` the expected seconds of it still to come, counted in the time left."""
        self.aside += spent_s
        self.aside_left = left_s

    def line(self, now: float, postfix: dict) -> str:
        """'[train] 40/100 steps, 5.2 s/step, elapsed 3:28, left 5:12 (loss=3.1)'; the time left counts the other
        work still to come (`set_aside`)."""
        elapsed = now - self.t0
        run = self.done - self.start_done
        per = (elapsed - self.aside) / run if run else float("nan")
        left = per * (self.total - self.done) + self.aside_left if run else float("nan")
        extra = "" if not postfix else " (" + ", ".join(f"{k}={v}" for k, v in postfix.items()) + ")"
        rate = f"{per:.2f} s/{self.unit}" if per == per else "-"
        left_text = _clock(left) if left == left else "-"
        return (f"[{self.desc}] {self.done}/{self.total} {self.unit}s, {rate}, elapsed {_clock(elapsed)}, "
                f"left {left_text}{extra}")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
