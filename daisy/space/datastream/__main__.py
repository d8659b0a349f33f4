"""Standalone server of only the /data routes (tests, bench):
    python -m daisy.space.datastream --host 127.0.0.1 --port 7861
"""
from daisy.space.datastream.routes import make_data_router
from daisy.space.datastream.source import DataSource


def main() -> None:
    import argparse

    import uvicorn
    from fastapi import FastAPI

    ap = argparse.ArgumentParser(description="Serve only the /data routes (tests, benchmarks).")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=7861)
    args = ap.parse_args()
    app = FastAPI()
    source = DataSource()
    source.start()
    app.include_router(make_data_router(source))
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
