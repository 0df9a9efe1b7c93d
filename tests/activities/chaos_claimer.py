"""One claiming process of the chaos test (tests/activities/test_claims_chaos.py); it is killed at random.

Loop: claim the item (1 s lease), write a few fenced artifacts, sometimes stall past the lease, release.
Every acknowledged step is appended to a log file and flushed before going on, so the checker knows what
this process was told succeeded, whatever moment the SIGKILL came at.
"""

import asyncio
import random
import sys
from pathlib import Path
from typing import TextIO

from store import Holder, StaleFence, Store, StoreUnavailable, WorkItemHeld

ITEM = "wi-chaos"


async def main(url: str, uid: str, log: TextIO) -> None:
    store = Store(url, pool_size=2)
    holder = Holder(uid, f"chaos/{uid}")
    rng = random.Random()

    def note(line: str) -> None:
        log.write(line + "\n")
        log.flush()

    while True:
        try:
            claim = await store.claim(ITEM, holder, lease_seconds=1.0)
        except (WorkItemHeld, StoreUnavailable):
            await asyncio.sleep(rng.uniform(0.005, 0.05))
            continue
        fence = claim.fence
        note(f"claimed {fence}")
        try:
            for i in range(rng.randint(1, 4)):
                if rng.random() < 0.05:
                    await asyncio.sleep(1.3)  # stall past the lease: someone may take the item over
                written = await store.put_artifact(
                    holder, fence, f"fence-{fence}-{i}", content=uid.encode(), work_item_ref=ITEM
                )
                note(f"wrote {fence} {written}")
                await asyncio.sleep(rng.uniform(0, 0.02))
            await store.release(ITEM, holder, fence)
            note(f"released {fence}")
        except StaleFence:
            note(f"stale {fence}")
        await asyncio.sleep(rng.uniform(0, 0.03))


if __name__ == "__main__":
    with Path(sys.argv[3]).open("a", buffering=1) as log_file:
        asyncio.run(main(sys.argv[1], sys.argv[2], log_file))
