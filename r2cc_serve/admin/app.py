"""The admin REST API: one router, served standalone (`r2cc admin`) or inside vLLM.

    create_app()                 full app and OpenAPI schema, no group attached
    create_app(source=...)       attached to a group's control agents
    build_router(state)          the same routes for vLLM's endpoint plugin
"""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter, Depends, FastAPI, Header, Path, Query
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException

from r2cc_serve import __version__, envs
from r2cc_serve.admin.actions import ACTIONS
from r2cc_serve.admin.auth import (FULL, NO_TOKEN, configured_read_token, configured_token, fingerprint, read_access,
                                   read_refusal, token_checker)
from r2cc_serve.admin.models import ActionResult, ErrorBody, EventList, Health, PlanList, Rail, RailList
from r2cc_serve.admin.snapshot import without_audit_detail, without_decision_authors
from r2cc_serve.admin.sources import StaticSource
from r2cc_serve.admin.view import ActionError, GroupView
from r2cc_serve.health.decisions import PLAIN_TEXT_PATTERN, REASON_MAX_CHARS

PREFIX = "/r2cc/v1"
_READ_ERRORS = {401: {"model": ErrorBody}}
_ERRORS = {401: {"model": ErrorBody}, 403: {"model": ErrorBody}, 404: {"model": ErrorBody},
           409: {"model": ErrorBody}, 502: {"model": ErrorBody},
           503: {"model": ErrorBody}}


class AdminState:
    """What the routes need; the vLLM plugin fills `view` in once the engine is up."""

    def __init__(self, source=None, token: str | None = None, why_no_token: str = NO_TOKEN,
                 read_token: str | None = None):
        self.view = GroupView(source or StaticSource([]), envs.get("R2CC_ADMIN_REFRESH_MS") / 1000.0)
        self.token = token
        self.why_no_token = why_no_token
        self.read_token = read_token  # R2CC_ADMIN_READ_TOKEN
        self.api_keys: list[str] = []  # vLLM's --api-key, once the endpoint plugin has vLLM's arguments

    def read_tokens(self) -> list[str]:
        """What admits a read besides the mutation token; empty: reads are open."""
        return ([self.read_token] if self.read_token else []) + self.api_keys

    def reader(self):
        """A FastAPI dependency for the GET routes: what this caller may see (auth.FULL or
        auth.NO_AUDIT_DETAIL); 401 when reads need a token and the caller sent none that fits."""

        # async: FastAPI would run a plain def in its thread pool, and under load that hop (a
        # thread to wake, the GIL to win back) was the tail of every admin read.
        async def check(authorization: str | None = Header(
                default=None, description="Bearer <R2CC_ADMIN_READ_TOKEN, vLLM's --api-key or the admin token>; "
                                          "needed when one of the first two is set")) -> str:
            access = read_access(authorization, self.token, self.read_tokens())
            if access is None:
                named = (["R2CC_ADMIN_READ_TOKEN"] if self.read_token else []) + (
                    ["vLLM's --api-key"] if self.api_keys else [])
                raise HTTPException(401, read_refusal(named), headers={"WWW-Authenticate": "Bearer"})
            return access

        return check

    async def ready_view(self) -> GroupView:
        await self.view.ensure_running()
        return self.view


def _error(exc: ActionError) -> JSONResponse:
    return JSONResponse(status_code=exc.status, content={"detail": exc.detail})


class _Route(APIRoute):
    """Malformed input answers 422 with FastAPI's detail wherever the router is mounted: vLLM's
    API server turns validation errors into 400 app-wide, which is not what the API promises."""

    def get_route_handler(self):
        handler = super().get_route_handler()

        async def handle(request):
            try:
                return await handler(request)
            except RequestValidationError as exc:
                return JSONResponse(status_code=422, content={"detail": jsonable_encoder(exc.errors())})
            except HTTPException as exc:  # a token check: answered as the API documents it, not as vLLM's handler would
                return JSONResponse(status_code=exc.status_code, content={"detail": exc.detail}, headers=exc.headers)

        return handle


def _audited(state: "AdminState", action: str) -> type[APIRoute]:
    """The route class of a mutation: every request is recorded in the audit trail with the
    answer it got, also when the token check or validation turned it away."""

    class AuditedRoute(_Route):
        def get_route_handler(self):
            handler = super().get_route_handler()

            async def handle(request):
                try:
                    response = await handler(request)
                except HTTPException as exc:  # the token check (401, 403): answered here so it is recorded
                    response = JSONResponse(status_code=exc.status_code, content={"detail": exc.detail},
                                            headers=exc.headers)
                state.view.audit.record(action, request, response.status_code, getattr(response, "body", b""))
                return response

            return handle

    return AuditedRoute


def build_router(state: AdminState) -> APIRouter:
    router = APIRouter(prefix=PREFIX, tags=["r2cc"], route_class=_Route)
    mutating = [Depends(token_checker(state.token, state.why_no_token))]
    Reader = Depends(state.reader())
    HostParam = Path(description="host name as shown by GET /rails (e.g. r2cc-h0)", max_length=200)
    RailParam = Path(ge=0, le=4096, description="rail index on that host")
    ForceParam = Query(False, description="allow draining or failing the last healthy rail of a host")
    ReasonParam = Query(None, max_length=REASON_MAX_CHARS, pattern=PLAIN_TEXT_PATTERN,
                        description="why (plain text, one line): kept with a drain or failover, shown beside "
                                    "the rail and in the audit events")

    @router.get("/rails", response_model=RailList, responses=_READ_ERRORS, summary="Every host's rails")
    async def list_rails(access: str = Reader):
        snap = (await state.ready_view()).snap
        # Encoded once per refresh by the view's poller thread: no per-request work on the loop.
        return Response(snap.rails_json if access == FULL else snap.rails_json_redacted, media_type="application/json")

    @router.get("/rails/{host}/{rail}", response_model=Rail, responses=_ERRORS, summary="One rail")
    async def get_rail(host: str = HostParam, rail: int = RailParam, access: str = Reader):
        view = await state.ready_view()
        try:
            one = view.rail(host, rail)
        except ActionError as exc:
            return _error(exc)
        return one if access == FULL else without_decision_authors([one])[0]

    def action_route(action: str, doc: str):
        async def act(host: str = HostParam, rail: int = RailParam, force: bool = ForceParam,
                      reason: str | None = ReasonParam):
            view = await state.ready_view()
            try:
                # Only a request with the configured token gets here: it is who acted.
                return await view.act(host, rail, action, force=force, reason=reason, by=fingerprint(state.token))
            except ActionError as exc:
                return _error(exc)

        router.add_api_route(f"/rails/{{host}}/{{rail}}/{action}", act, methods=["POST"], response_model=ActionResult,
                             responses=_ERRORS, dependencies=mutating, summary=doc, name=f"rail_{action}",
                             route_class_override=_audited(state, action))

    for action, summary in ACTIONS.items():  # `r2cc rails ACTION` offers the same ones
        action_route(action, summary)

    @router.get("/health", response_model=Health, responses={503: {"model": Health}, **_READ_ERRORS},
                summary="Group health")
    async def health(access: str = Reader):
        snap = (await state.ready_view()).snap
        return Response(snap.health_json if access == FULL else snap.health_json_redacted,
                        status_code=503 if snap.health["status"] == "down" else 200, media_type="application/json")

    @router.get("/plan", response_model=PlanList, responses=_READ_ERRORS, dependencies=[Reader],
                summary="Each group's all_reduce schedule and bandwidth table")
    async def plan():
        return {"groups": (await state.ready_view()).snap.plans()}

    @router.get("/events", response_model=EventList, responses=_READ_ERRORS,
                summary="Recent rail events and admin mutations, oldest first")
    async def events(limit: int = Query(100, ge=1, le=1000),
                     kind: list[Literal["rail", "peer", "admin"]] | None = Query(
                         None, description="only these kinds (repeat it: ?kind=rail&kind=peer); default all"),
                     access: str = Reader):
        view = await state.ready_view()
        evs = view.events(limit, kinds=set(kind) if kind else None)
        return {"events": evs if access == FULL else [without_audit_detail(e) for e in evs]}

    return router


def create_app(source=None, token: str | None = None, read_token: str | None = None) -> FastAPI:
    """The standalone admin app (its own /metrics, read like the rest). With no source it has no
    group attached. token, read_token: R2CC_ADMIN_TOKEN and R2CC_ADMIN_READ_TOKEN when not given."""
    from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

    from r2cc_serve.admin.metrics import R2CCCollector

    state = AdminState(source, token if token is not None else configured_token(),
                       read_token=read_token if read_token is not None else configured_read_token())
    app = FastAPI(title="r2cc admin API", version=__version__,
                  description="Rail health, drain and failover for an r2cc group; Prometheus metrics at /metrics.")
    app.include_router(build_router(state))
    registry = CollectorRegistry()
    registry.register(R2CCCollector(state.view, mutations_enabled=state.token is not None))
    app.state.r2cc = state

    @app.get("/metrics", response_class=PlainTextResponse, responses=_READ_ERRORS, dependencies=[Depends(state.reader())],
             summary="Prometheus metrics (r2cc_*)")
    async def metrics():
        await state.ready_view()
        return PlainTextResponse(generate_latest(registry).decode(), media_type=CONTENT_TYPE_LATEST)

    return app
