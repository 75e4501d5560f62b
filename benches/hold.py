"""Holds N connections to 127.0.0.1:PORT open (benches/load.sh): `idle` sends nothing,
`partial` sends the start of a request's header and no more. Prints "open N" once all are
open, then holds them until it is killed."""

import asyncio
import sys

PARTIAL = b"POST /v1/chat/completions HTTP/1.1\r\nHost: bench\r\n"


async def main(port: int, n: int, mode: str) -> None:
    held = []

    async def one() -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        if mode == "partial":
            writer.write(PARTIAL)
            await writer.drain()
        held.append((reader, writer))

    for start in range(0, n, 500):
        await asyncio.gather(*(one() for _ in range(min(500, n - start))))
    print(f"open {len(held)}", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]))
