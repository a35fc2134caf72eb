"""The operator admin API: `create_app()` builds the standalone app (see app.py).

Imported lazily so that workers reading one submodule (snapshot, sources) do not pay
for FastAPI."""


def __getattr__(name):
    if name == "create_app":
        from r2cc_serve.admin.app import create_app

        return create_app
    raise AttributeError(f"module 'r2cc_serve.admin' has no attribute {name!r}")


__all__ = ["create_app"]
