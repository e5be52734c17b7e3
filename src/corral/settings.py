"""corral's settings: defaults < corral.toml < CORRAL_* environment < command-line flags."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from corral.domain.arrays import DEFAULT_MAX_ARRAY_SIZE
from corral.domain.bounds import DEFAULT_MAX_REQUEST_BYTES, MIN_MAX_REQUEST_BYTES
from corral.domain.retry.policy import RetryPolicy
from corral.domain.slots import ResourceSlots
from corral.domain.tokens import DEFAULT_TOKEN_TTL_DAYS, MAX_TOKEN_LIFETIME_S
from corral.infra.locks import DEFAULT_LOCK_TTL_S
from corral.store.database import async_url
from corral.store.kernel_logs import DEFAULT_LOG_CAP_BYTES
from corral.store.retention import DEFAULT_RETENTION_DAYS
from corral.store.uploads import DEFAULT_UNUSED_UPLOAD_HOURS


def default_data_dir() -> Path:
    """`$XDG_DATA_HOME/corral`, else `~/.local/share/corral`."""
    base = os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share"
    return Path(base) / "corral"


def config_file() -> Path:
    """Where `corral.toml` is read from: `$CORRAL_CONFIG`, else `./corral.toml`."""
    return Path(os.environ.get("CORRAL_CONFIG", "corral.toml"))


class Settings(BaseSettings):
    """Every setting of corral, with its default and its CORRAL_* environment variable."""

    model_config = SettingsConfigDict(env_prefix="CORRAL_", extra="forbid")

    data_dir: Path = Field(default_factory=default_data_dir)
    database_url: str | None = Field(
        default=None, description="sqlite:///path or postgresql://user@host:port/db"
    )
    redis_url: str | None = Field(default=None, description="redis://host:port/db (optional)")
    # The coordinator's dual loop: hinted runs at most this often (and at once on a pushed
    # hint), and every task runs unconditionally each long interval.
    short_interval_s: float = Field(default=2.0, gt=0, description="hinted loop tick, seconds")
    long_interval_s: float = Field(default=60.0, gt=0, description="forced loop tick, seconds")
    # Agents: the secret a new agent presents to join, and how long one may stay silent
    # before it is LOST (its kernels fail with cause agent_lost).
    join_token: SecretStr | None = Field(default=None, description="agents' join token")
    heartbeat_timeout_s: float = Field(default=30.0, gt=0, description="agent silence limit")
    assignment_wait_s: float = Field(default=30.0, gt=0, le=120, description="long-poll wait")
    # Kernels' logs: each stream keeps its newest bytes (0: no cap); ended sessions, with
    # their logs, history and events, are deleted this many days after they ended (0: kept).
    log_cap_bytes: int = Field(
        default=DEFAULT_LOG_CAP_BYTES, ge=0, description="per kernel and stream, bytes"
    )
    retention_days: float = Field(
        default=DEFAULT_RETENTION_DAYS, ge=0, description="days an ended session is kept"
    )
    # Task locks (Redis or PostgreSQL): a Redis lock's time to live, renewed every third of it,
    # so a killed manager's locks are free after at most this long; also the deadline of every
    # call to the lock's server.
    lock_ttl_s: float = Field(
        default=DEFAULT_LOCK_TTL_S, gt=0, le=300, description="task lock TTL, seconds"
    )
    # A job array is created in one transaction: this bounds how much one request may write.
    max_array_size: int = Field(
        default=DEFAULT_MAX_ARRAY_SIZE, ge=1, le=1_000_000, description="elements of one job array"
    )
    # The cluster's default retry policy (spec document 5), under every resource group's and
    # session's: max_retries 0 (nothing is retried unless someone opts in). In corral.toml a
    # [retry_policy_default] table; in the environment JSON, CORRAL_RETRY_POLICY_DEFAULT=
    # '{"max_retries": 1, "retry_delay": 30}'.
    retry_policy_default: RetryPolicy = Field(default_factory=RetryPolicy)
    # The largest request body the API reads (413 past it); uploads and agents' outputs have
    # caps of their own. At least what a session at every limit of its spec takes.
    max_request_bytes: int = Field(
        default=DEFAULT_MAX_REQUEST_BYTES,
        ge=MIN_MAX_REQUEST_BYTES,
        description="the cap of one request body, bytes",
    )
    # The most of each slot one kernel may ask for, e.g. "cpu=64,mem=512Gi,cuda.device=8"
    # (a submission asking more is refused, 422 on resources.<slot>); slots not named are
    # bounded only by corral's own limit (1P, 10¹⁵, of a slot in a session).
    max_kernel_slots: ResourceSlots | None = Field(
        default=None, description="per-slot maximum of one kernel's request"
    )
    # `corral run --upload`: the largest archive of a directory the manager stores, and how
    # long one that no kept session names is kept after it was stored or last asked for.
    upload_max_bytes: int = Field(
        default=100 * 1024 * 1024, gt=0, description="the cap of one upload, bytes"
    )
    unused_upload_hours: float = Field(
        default=DEFAULT_UNUSED_UPLOAD_HOURS,
        ge=0,
        description="hours an upload no session names is kept (0: for ever)",
    )

    # Users' API tokens: how long a new one lasts when its maker names no expiry (0: for ever).
    token_ttl_days: float = Field(
        default=DEFAULT_TOKEN_TTL_DAYS,
        ge=0,
        le=MAX_TOKEN_LIFETIME_S / 86_400,
        description="days a new user token lasts by default (0: never expires)",
    )

    @field_validator("database_url")
    @classmethod
    def _check_database_url(cls, value: str | None) -> str | None:
        if value is not None:
            async_url(value)  # raises DatabaseURLError (a ValueError) naming the problem
        return value

    @model_validator(mode="after")
    def _short_within_long(self) -> Settings:
        if self.short_interval_s > self.long_interval_s:
            raise ValueError(
                f"short_interval_s ({self.short_interval_s}) must not exceed "
                f"long_interval_s ({self.long_interval_s})"
            )
        return self

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # First wins: flags (init), then environment, then corral.toml.
        toml = TomlConfigSettingsSource(settings_cls, toml_file=config_file())
        return (init_settings, env_settings, toml)

    def token_ttl_s(self) -> float | None:
        """`token_ttl_days` in seconds; None when tokens never expire by default."""
        return self.token_ttl_days * 86_400 or None

    def resolved_database_url(self) -> str:
        """The database to use: the configured URL, else `corral.db` in the data directory."""
        if self.database_url:
            return self.database_url
        return f"sqlite:///{self.data_dir.expanduser() / 'corral.db'}"


def load_settings(**flags: Any) -> Settings:
    """Settings with command-line flags applied on top (flags that are None are not given)."""
    return Settings(**{key: value for key, value in flags.items() if value is not None})
