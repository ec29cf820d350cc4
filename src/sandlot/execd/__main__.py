"""``python -m sandlot.execd``."""

import sys

from sandlot.execd import lazyimports

lazyimports.install()  # before asyncio, uvicorn and starlette import ssl/hashlib (see lazyimports)

from sandlot.execd.main import main  # noqa: E402

sys.exit(main())
