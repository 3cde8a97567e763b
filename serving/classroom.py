"""A class at once: the store behind the Lessons tab's class mode (issue 51). No gradio here.

A teacher opens a class and gets a short join code (for the room) and a secret teacher token (for the teacher
link); students join with the code and a nickname and get a student token of their own (kept in their page's
session). The class holds the teacher's lesson and step: the step's choices, its right answer, whether it is
revealed. Each student's *first* answer per step is recorded; the teacher sees the counts per choice before
revealing (and, on their own page only, who has not answered yet), reveals, may ask a step again (its answers
cleared for the class), moves on, exports the answers and a per-question summary as CSV and closes the class. A
class ends by itself a day after it was opened. An ended class (closed or expired) can no longer be read by
anyone, so its rows (nicknames and answers included) are deleted the next time any class is opened (`purge`).

Storage: SQLAlchemy Core over SQLite by default (one file, WAL journal, so readers never wait for the writer and a
committed answer survives the server being killed) or over PostgreSQL given by ``ATLAS_DB`` (several replicas
then share one class). The schema is versioned with Alembic (``serving/migrations``) and brought up to date by
`open_store`, which the app runs in the background as it starts (`open_in_background`).

Who may do what (every rule raises `ClassError` with a sentence for the user, and changes nothing):
- only the teacher token reveals, advances, exports or closes; it is compared in constant time
  (``hmac.compare_digest``) with the SHA-256 kept in the store, never stored in clear;
- a presenter token (`presenter_token`, given to the teacher only) reads what the room may see and nothing more (the
  projector's page: where the class is, the counts, the answer once revealed; no nickname, no control); it is an
  HMAC of the class's code keyed by the stored teacher hash, so nothing new is stored and it is as hard to guess as
  the teacher token (128 bits kept);
- a join code is 6 characters from a 31-letter alphabet without look-alikes: 31⁶ ≈ 8.9 × 10⁸ codes. With 100
  classes open at once, one guess hits one of them with odds 100 / 8.9e8 ≈ 1.1e-7; failed joins (well-formed codes
  that no class has) are limited per client address to a burst of `JOIN_FAILS_BURST` (120: a room of 100 behind
  one NAT may each mistype once) and then `JOIN_FAILS_PER_MINUTE` (10) a minute, so one address gets about 14,500
  guesses a day: odds ≈ 1.6e-3 a day of landing in *some* class of those 100, as a student only (a code gives no
  teacher rights);
- a nickname is plain text, control and format characters removed, at most 32 characters (longer is refused, not
  cut); the tabs escape it wherever it is shown; students never see each other's nicknames (only counts);
- a class holds at most `MAX_STUDENTS` (500) students; nothing else about a student is stored (no address, no
  browser data): the nickname, a hash of the student token, and the answers with their times.
"""

from __future__ import annotations

import csv
import hashlib
import hmac
import io
import os
import secrets
import threading
import time
import unicodedata
from dataclasses import dataclass
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.engine import Engine

MAX_STUDENTS = 500
MAX_NICKNAME = 32
LIFETIME_S = 24 * 3600  # a class ends by itself a day after it was opened
CODE_ALPHABET = "23456789ABCDEFGHJKMNPQRSTUVWXYZ"  # 31 letters: no 0/O, 1/I/L look-alikes
CODE_LENGTH = 6
JOIN_FAILS_PER_MINUTE = int(os.environ.get("ATLAS_CLASS_JOIN_FAILS", "10"))  # wrong codes earned back a minute
JOIN_FAILS_BURST = int(os.environ.get("ATLAS_CLASS_JOIN_BURST", "120"))  # wrong codes at once from one address
MAX_CHOICES = 8
MAX_CHOICE_CHARS = 200
MAX_INPUT_CHARS = 2000
ROOT = Path(__file__).resolve().parents[1]


class ClassError(Exception):
    """Something a person asked of a class that is not allowed; its message is meant for them."""


# ------------------------------------------------------------------------------------------------- schema
metadata = sa.MetaData()
classes = sa.Table(
    "classes", metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("code", sa.String(CODE_LENGTH), nullable=False, unique=True),
    sa.Column("teacher_hash", sa.String(64), nullable=False),  # sha256 hex of the teacher token
    sa.Column("created_at", sa.Float, nullable=False),  # Unix seconds
    sa.Column("expires_at", sa.Float, nullable=False),
    sa.Column("closed", sa.Boolean, nullable=False, default=False),
    # the step the class is on: lesson and step numbers (1-based), the lesson's input, the step's choices (JSON
    # list), the answer the numbers make right, and whether the teacher has revealed it
    sa.Column("lesson", sa.Integer, nullable=False),
    sa.Column("step", sa.Integer, nullable=False),
    sa.Column("input", sa.Text, nullable=False, default=""),
    sa.Column("choices", sa.JSON, nullable=False),
    sa.Column("answer", sa.Text, nullable=False),
    sa.Column("revealed", sa.Boolean, nullable=False, default=False),
)
students = sa.Table(
    "students", metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("class_id", sa.Integer, sa.ForeignKey("classes.id", ondelete="CASCADE"), nullable=False, index=True),
    sa.Column("token_hash", sa.String(64), nullable=False, unique=True),
    sa.Column("nickname", sa.String(MAX_NICKNAME), nullable=False),
    sa.Column("joined_at", sa.Float, nullable=False),
)
answers = sa.Table(
    "answers", metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("class_id", sa.Integer, sa.ForeignKey("classes.id", ondelete="CASCADE"), nullable=False),
    sa.Column("student_id", sa.Integer, sa.ForeignKey("students.id", ondelete="CASCADE"), nullable=False),
    sa.Column("lesson", sa.Integer, nullable=False),
    sa.Column("step", sa.Integer, nullable=False),
    sa.Column("choice", sa.Text, nullable=False),
    sa.Column("correct", sa.Boolean, nullable=False),
    sa.Column("answered_at", sa.Float, nullable=False),
    sa.UniqueConstraint("student_id", "lesson", "step", name="one_answer_per_step"),  # the first answer counts
    sa.Index("answers_by_step", "class_id", "lesson", "step"),
)
class_steps = sa.Table(  # each step the class was asked (the summary after class), with what was offered
    "class_steps", metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("class_id", sa.Integer, sa.ForeignKey("classes.id", ondelete="CASCADE"), nullable=False),
    sa.Column("lesson", sa.Integer, nullable=False),
    sa.Column("step", sa.Integer, nullable=False),
    sa.Column("choices", sa.JSON, nullable=False),
    sa.Column("answer", sa.Text, nullable=False),
    sa.Column("asked_at", sa.Float, nullable=False),
    sa.Column("asks", sa.Integer, nullable=False, server_default="1"),  # 2: asked again (`reask`)
    sa.UniqueConstraint("class_id", "lesson", "step", name="one_row_per_step"),
)


# ------------------------------------------------------------------------------------------- the database
def data_dir() -> Path:
    """Where the SQLite file lives: ``ATLAS_DATA``; else ``/data`` when it exists and is writable (a Space with
    persistent storage mounts it there); else ``data/`` beside app.py (git-ignored)."""
    if os.environ.get("ATLAS_DATA"):
        return Path(os.environ["ATLAS_DATA"])
    if os.path.isdir("/data") and os.access("/data", os.W_OK):
        return Path("/data")
    return ROOT / "data"


def database_url() -> str:
    """``ATLAS_DB`` (``postgresql+psycopg://user:pass@host/db``; a bare ``postgresql://`` gets the psycopg driver),
    else a SQLite file ``atlas.sqlite3`` in `data_dir`."""
    url = os.environ.get("ATLAS_DB", "").strip()
    if url.startswith("postgresql://") or url.startswith("postgres://"):
        url = "postgresql+psycopg://" + url.split("://", 1)[1]
    if url:
        return url
    folder = data_dir()
    folder.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{folder / 'atlas.sqlite3'}"


def make_engine(url: str) -> Engine:
    """An engine for ``url``; SQLite gets WAL (readers do not wait for the writer; a commit is on disk in the WAL
    when it returns, so a killed server loses nothing committed), a 10 s busy timeout instead of "database is
    locked" under a burst of answers, and foreign keys on."""
    if url.startswith("sqlite"):
        engine = sa.create_engine(url, connect_args={"check_same_thread": False, "timeout": 10})

        @sa.event.listens_for(engine, "connect")
        def _pragmas(conn, _record) -> None:
            cur = conn.cursor()
            for pragma in ("journal_mode=WAL", "synchronous=NORMAL", "foreign_keys=ON", "busy_timeout=10000"):
                cur.execute(f"PRAGMA {pragma}")
            cur.close()

        return engine
    return sa.create_engine(url, pool_pre_ping=True, pool_size=8, max_overflow=16)


def migrate(engine: Engine) -> None:
    """``alembic upgrade head`` on ``engine``, with a Config built here (no alembic.ini): serving/migrations."""
    from alembic import command
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(Path(__file__).with_name("migrations")))
    with engine.begin() as conn:
        if conn.dialect.name == "postgresql":  # replicas starting together migrate one at a time
            conn.execute(sa.text("SELECT pg_advisory_xact_lock(51051)"))
        config.attributes["connection"] = conn
        command.upgrade(config, "head")


# ----------------------------------------------------------------------------------------------- helpers
def _hash(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "replace")).hexdigest()


def _presenter_of(row) -> str:
    """A class's presenter token: HMAC-SHA256 of "presenter:CODE" keyed by its teacher hash, 32 hex digits."""
    return hmac.new(row.teacher_hash.encode(), f"presenter:{row.code}".encode(), hashlib.sha256).hexdigest()[:32]


def clean_nickname(text: object) -> str:
    """A nickname as stored: plain text without control, format (bidi overrides, zero-width) or unassigned
    characters, spaces at the ends stripped; empty or longer than 32 characters is refused."""
    raw = str(text or "")
    if len(raw) > 4 * MAX_NICKNAME:  # a 10 kB paste is refused before anything is done with it
        raise ClassError(f"A nickname has at most {MAX_NICKNAME} characters.")
    name = "".join(ch for ch in raw if unicodedata.category(ch)[0] != "C").strip()
    if not name:
        raise ClassError("Type a nickname to join (any name the class may see on the teacher's screen).")
    if len(name) > MAX_NICKNAME:
        raise ClassError(f"A nickname has at most {MAX_NICKNAME} characters; this one has {len(name)}.")
    return name


def normalise_code(code: object) -> str:
    """A join code as typed (any case, spaces and dashes ignored); one that cannot be a code is refused."""
    text = str(code or "")[:40].upper().replace(" ", "").replace("-", "")
    if len(text) != CODE_LENGTH or any(ch not in CODE_ALPHABET for ch in text):
        raise ClassError(f"A join code is {CODE_LENGTH} letters and digits, as the teacher's screen shows it.")
    return text


def _csv_cell(text: str) -> str:
    """A nickname or choice safe in a spreadsheet: a leading = + - @ would make it a formula (CSV injection)."""
    return "'" + text if text[:1] in ("=", "+", "-", "@", "\t", "\r") else text


class JoinLimiter:
    """Failed joins (a well-formed code that no class has) per client address, as a token bucket: an address may
    fail `JOIN_FAILS_BURST` times at once (a room of 100 behind one NAT, each student mistyping once), and earns
    back `JOIN_FAILS_PER_MINUTE` tries a minute; with none left every join from that address is refused until one
    is earned back, so guessing codes stays slow (at most burst + 1,440 × rate a day). Per process: replicas behind
    a load balancer each keep their own (the odds in the module docstring then scale with their number)."""

    def __init__(self, per_minute: int = JOIN_FAILS_PER_MINUTE, burst: int = JOIN_FAILS_BURST,
                 clock=time.time) -> None:
        self.per_minute, self.burst, self.clock = max(1, per_minute), max(1, burst), clock
        self.buckets: dict[str, tuple[float, float]] = {}  # address -> (tries left, when counted)
        self.lock = threading.Lock()

    def _left(self, who: str, now: float) -> float:
        left, then = self.buckets.get(who, (float(self.burst), now))
        return min(float(self.burst), left + (now - then) * self.per_minute / 60.0)

    def check(self, who: str) -> None:
        now = self.clock()
        with self.lock:
            left = self._left(who, now)
            if left < 1:
                wait = int((1 - left) * 60.0 / self.per_minute) + 1
                raise ClassError(f"Too many wrong join codes from your network: try again in {wait} s.")
            if left >= self.burst:
                self.buckets.pop(who, None)  # a full bucket is not kept

    def failed(self, who: str) -> None:
        now = self.clock()
        with self.lock:
            self.buckets[who] = (self._left(who, now) - 1, now)
            if len(self.buckets) > 100_000:  # forget full buckets when many addresses have failed
                self.buckets = {k: v for k, v in self.buckets.items() if self._left(k, now) < self.burst}


# ----------------------------------------------------------------------------------------------- the store
@dataclass(frozen=True)
class Opened:
    """What the teacher gets once: the join code and the secret token (only its hash is kept)."""

    code: str
    token: str


@dataclass(frozen=True)
class Joined:
    code: str
    token: str  # the student's own token: their answers are recorded under it
    nickname: str


@dataclass(frozen=True)
class ClassState:
    """What anybody in the class may see: where the class is, and whether the step is revealed (its right answer
    only once revealed). ``students`` and ``counts`` (choice -> how many chose it, every choice listed) are the room
    as a whole; no nickname."""

    code: str
    lesson: int
    step: int
    input: str
    choices: tuple[str, ...]
    revealed: bool
    answer: str | None
    students: int
    counts: dict[str, int]
    closed: bool
    expires_at: float

    @property
    def answered(self) -> int:
        return sum(self.counts.values())


@dataclass(frozen=True)
class StepSummary:
    """One question of a class, after the fact (the teacher's summary and its CSV): how many answered, how many
    were right, and how many chose each choice (every offered choice listed, in the offered order)."""

    lesson: int
    step: int
    choices: tuple[str, ...]
    answer: str
    answered: int
    correct: int
    counts: dict[str, int]
    asks: int = 1


class ClassStore:
    """The class operations over one engine (see the module docstring for the rules)."""

    def __init__(self, engine: Engine, limiter: JoinLimiter | None = None, clock=time.time) -> None:
        self.engine, self.clock = engine, clock
        self.limiter = limiter or JoinLimiter(clock=clock)

    # ---------------------------------------------------------------------------------------- reading
    def _class(self, conn, code: object, *, for_update: bool = False) -> sa.Row:
        """The open class behind a code; unknown, expired and closed classes are refused with their reason."""
        query = sa.select(classes).where(classes.c.code == normalise_code(code))
        row = conn.execute(query.with_for_update() if for_update else query).first()
        if row is None:
            raise ClassError("No class has this join code: check it with the teacher's screen.")
        if row.closed:
            raise ClassError("This class has been closed by its teacher.")
        if row.expires_at <= self.clock():
            raise ClassError("This class has expired (a class lasts a day); the teacher can open a new one.")
        return row

    def _teacher(self, conn, code: object, token: object, *, for_update: bool = False) -> sa.Row:
        row = self._class(conn, code, for_update=for_update)
        if not hmac.compare_digest(_hash(str(token or "")[:200]), row.teacher_hash):
            raise ClassError("Only the teacher link of this class can do that.")
        return row

    def _presenter(self, conn, code: object, token: object) -> sa.Row:
        row = self._class(conn, code)
        if not hmac.compare_digest(_presenter_of(row), str(token or "")[:200]):
            raise ClassError("This presenter link is not the class's: ask the teacher's screen for it again.")
        return row

    def _student(self, conn, token: object) -> tuple[sa.Row, sa.Row]:
        me = conn.execute(sa.select(students).where(students.c.token_hash == _hash(str(token or "")[:200]))).first()
        if me is None:
            raise ClassError("Join the class first (its code and a nickname).")
        row = conn.execute(sa.select(classes.c.code).where(classes.c.id == me.class_id)).first()
        return me, self._class(conn, row.code)

    def _counts(self, conn, row: sa.Row) -> dict[str, int]:
        got = dict(conn.execute(
            sa.select(answers.c.choice, sa.func.count()).where(
                answers.c.class_id == row.id, answers.c.lesson == row.lesson, answers.c.step == row.step)
            .group_by(answers.c.choice)).all())
        return {c: int(got.get(c, 0)) for c in row.choices}

    def _state(self, conn, row: sa.Row) -> ClassState:
        n = conn.execute(sa.select(sa.func.count()).select_from(students)
                         .where(students.c.class_id == row.id)).scalar_one()
        return ClassState(row.code, row.lesson, row.step, row.input, tuple(row.choices), row.revealed,
                          row.answer if row.revealed else None, int(n), self._counts(conn, row), row.closed,
                          row.expires_at)

    def state(self, code: object) -> ClassState:
        """The class as the room may see it (counts, no nicknames, the answer only once revealed)."""
        with self.engine.connect() as conn:
            return self._state(conn, self._class(conn, code))

    def student_state(self, token: object) -> tuple[ClassState, str, str | None]:
        """A student's view: the class, their nickname and their own answer to the current step (or None)."""
        with self.engine.connect() as conn:
            me, row = self._student(conn, token)
            mine = conn.execute(sa.select(answers.c.choice).where(
                answers.c.student_id == me.id, answers.c.lesson == row.lesson, answers.c.step == row.step)
            ).scalar_one_or_none()
            return self._state(conn, row), me.nickname, mine

    def teacher_state(self, code: object, token: object) -> ClassState:
        """The class for its teacher: the same as `state` plus the right answer before the reveal."""
        with self.engine.connect() as conn:
            row = self._teacher(conn, code, token)
            state = self._state(conn, row)
            return ClassState(**{**state.__dict__, "answer": row.answer})

    def presenter_token(self, code: object, token: object) -> str:
        """The class's read-only presenter token, for its teacher only (a projector's link: `presenter_state`)."""
        with self.engine.connect() as conn:
            return _presenter_of(self._teacher(conn, code, token))

    def presenter_state(self, code: object, token: object) -> ClassState:
        """The class as the room sees it (`state`), for a page holding the presenter token; a wrong token is refused."""
        with self.engine.connect() as conn:
            return self._state(conn, self._presenter(conn, code, token))

    def open_choices(self, lesson: int, step: int) -> list[frozenset[str]]:
        """The choices of every class answering this lesson step now (open and not revealed): while one is, the
        public lesson endpoints must not give that step's answer (tabs/course/course.py, `guarded`)."""
        with self.engine.connect() as conn:
            rows = conn.execute(sa.select(classes.c.choices).where(
                classes.c.lesson == int(lesson), classes.c.step == int(step), sa.not_(classes.c.closed),
                sa.not_(classes.c.revealed), classes.c.expires_at > self.clock())).all()
        return [frozenset(str(c) for c in row.choices) for row in rows]

    # ---------------------------------------------------------------------------------------- writing
    @staticmethod
    def _step_values(lesson: int, step: int, choices: list[str], answer: str, text: str) -> dict:
        choices = [str(c)[:MAX_CHOICE_CHARS] for c in choices][:MAX_CHOICES]
        if not choices or str(answer)[:MAX_CHOICE_CHARS] not in choices:
            raise ClassError("A class step needs its choices and the right answer among them.")
        return {"lesson": int(lesson), "step": int(step), "input": str(text or "")[:MAX_INPUT_CHARS],
                "choices": choices, "answer": str(answer)[:MAX_CHOICE_CHARS], "revealed": False}

    def purge(self) -> int:
        """Delete the classes that have ended (closed, or past their day) with their students and answers: nobody
        can read them any more, so nothing of them is kept. Returns how many classes went."""
        with self.engine.begin() as conn:
            ended = sa.select(classes.c.id).where(sa.or_(classes.c.closed, classes.c.expires_at <= self.clock()))
            conn.execute(answers.delete().where(answers.c.class_id.in_(ended)))
            conn.execute(class_steps.delete().where(class_steps.c.class_id.in_(ended)))
            conn.execute(students.delete().where(students.c.class_id.in_(ended)))
            return conn.execute(classes.delete().where(classes.c.id.in_(ended))).rowcount

    def open(self, lesson: int, step: int, choices: list[str], answer: str, text: str = "") -> Opened:
        """A new class on this lesson step: a fresh join code and teacher token (ended classes are purged first)."""
        values = self._step_values(lesson, step, choices, answer, text)
        self.purge()
        token = secrets.token_urlsafe(32)
        now = self.clock()
        for _ in range(20):  # a clash with an existing code is about 1e-6 per class open: draw again
            code = "".join(secrets.choice(CODE_ALPHABET) for _ in range(CODE_LENGTH))
            try:
                with self.engine.begin() as conn:
                    new = conn.execute(classes.insert().values(code=code, teacher_hash=_hash(token), created_at=now,
                                                               expires_at=now + LIFETIME_S, closed=False, **values))
                    self._asked(conn, new.inserted_primary_key[0], values)
                return Opened(code, token)
            except sa.exc.IntegrityError:
                continue
        raise ClassError("Could not find a free join code; try again.")

    def join(self, code: object, nickname: object, who: str = "") -> Joined:
        """A student joins with the room's code; ``who`` (the client address) is what the failed-join limit
        counts. Refused: over the limit, an unknown/expired/closed code, a bad nickname, a full class."""
        self.limiter.check(who)
        name = clean_nickname(nickname)
        try:
            with self.engine.begin() as conn:
                row = self._class(conn, code, for_update=True)  # PostgreSQL: joins of one class one at a time
                token = secrets.token_urlsafe(24)
                conn.execute(students.insert().values(class_id=row.id, token_hash=_hash(token), nickname=name,
                                                      joined_at=self.clock()))
                # counted after the insert, in the same transaction: SQLite's write lock (or the row lock above)
                # makes concurrent joins queue here, so the cap holds exactly
                n = conn.execute(sa.select(sa.func.count()).select_from(students)
                                 .where(students.c.class_id == row.id)).scalar_one()
                if n > MAX_STUDENTS:
                    raise ClassError(f"This class is full ({MAX_STUDENTS} students).")
        except ClassError as err:
            if str(err).startswith("No class"):  # a code that is not well formed cannot hit a class: not a guess
                self.limiter.failed(who)
            raise
        return Joined(row.code, token, name)

    def answer(self, token: object, lesson: int, step: int, choice: object) -> str:
        """Record a student's first answer to the class's current step; returns it. A second answer to the same
        step, an answer to another step than the class's or after the reveal, or a choice not offered is refused
        and changes nothing."""
        try:
            return self._answer(token, int(lesson), int(step), choice)
        except sa.exc.IntegrityError:  # the same student's two answers at once: the first one won (the insert is
            # the transaction's only write, so nothing else is rolled back)
            raise ClassError("Your first answer to this step is already recorded; it counts.") from None

    def _answer(self, token: object, lesson: int, step: int, choice: object) -> str:
        with self.engine.begin() as conn:
            me, row = self._student(conn, token)
            if (int(lesson), int(step)) != (row.lesson, row.step):
                raise ClassError(f"The class is on lesson {row.lesson}, step {row.step} now; answer that one.")
            if row.revealed:
                raise ClassError("The teacher has revealed this step: answers to it are closed.")
            choice = str(choice or "")
            if choice not in row.choices:
                raise ClassError("That is not one of this step's choices.")
            first = conn.execute(sa.select(answers.c.choice).where(
                answers.c.student_id == me.id, answers.c.lesson == row.lesson, answers.c.step == row.step)
            ).scalar_one_or_none()
            if first is not None:
                raise ClassError(f"Your first answer to this step is recorded ({first}); it counts, not a new one.")
            conn.execute(answers.insert().values(class_id=row.id, student_id=me.id, lesson=row.lesson,
                                                 step=row.step, choice=choice, correct=choice == row.answer,
                                                 answered_at=self.clock()))
        return choice

    def reveal(self, code: object, token: object) -> ClassState:
        with self.engine.begin() as conn:
            row = self._teacher(conn, code, token, for_update=True)
            conn.execute(classes.update().where(classes.c.id == row.id).values(revealed=True))
        return self.teacher_state(code, token)

    def advance(self, code: object, token: object, lesson: int, step: int, choices: list[str], answer: str,
                text: str = "") -> ClassState:
        """Move the class to a lesson step (the next one, or any): the room follows; it starts unrevealed."""
        values = self._step_values(lesson, step, choices, answer, text)
        with self.engine.begin() as conn:
            row = self._teacher(conn, code, token, for_update=True)
            conn.execute(classes.update().where(classes.c.id == row.id).values(**values))
            self._asked(conn, row.id, values)
        return self.teacher_state(code, token)

    def _asked(self, conn, class_id: int, values: dict) -> None:
        """Keep the step the class is asked (its choices and answer: the same step with another input replaces them,
        and its earlier answers, which were to other choices, go)."""
        where = sa.and_(class_steps.c.class_id == class_id, class_steps.c.lesson == values["lesson"],
                        class_steps.c.step == values["step"])
        kept = conn.execute(sa.select(class_steps.c.choices, class_steps.c.answer).where(where)).first()
        if kept is None:
            conn.execute(class_steps.insert().values(class_id=class_id, lesson=values["lesson"], step=values["step"],
                                                     choices=values["choices"], answer=values["answer"],
                                                     asked_at=self.clock()))
        elif (list(kept.choices), kept.answer) != (values["choices"], values["answer"]):
            conn.execute(answers.delete().where(answers.c.class_id == class_id, answers.c.lesson == values["lesson"],
                                                answers.c.step == values["step"]))
            conn.execute(class_steps.update().where(where).values(choices=values["choices"], answer=values["answer"],
                                                                  asked_at=self.clock()))

    def reask(self, code: object, token: object) -> ClassState:
        """Ask the class's current step again: its answers are deleted for the whole class (students may answer it
        anew) and it is no longer revealed; the summary counts how often it was asked."""
        with self.engine.begin() as conn:
            row = self._teacher(conn, code, token, for_update=True)
            conn.execute(answers.delete().where(answers.c.class_id == row.id, answers.c.lesson == row.lesson,
                                                answers.c.step == row.step))
            conn.execute(classes.update().where(classes.c.id == row.id).values(revealed=False))
            conn.execute(class_steps.update().where(
                class_steps.c.class_id == row.id, class_steps.c.lesson == row.lesson, class_steps.c.step == row.step)
                .values(asks=class_steps.c.asks + 1, asked_at=self.clock()))
        return self.teacher_state(code, token)

    def missing(self, code: object, token: object) -> list[str]:
        """The teacher's list of who has not answered the current step yet: the joined students' nicknames without
        an answer to it, in the order they joined (nicknames go to the teacher only)."""
        with self.engine.connect() as conn:
            row = self._teacher(conn, code, token)
            answered = sa.select(answers.c.student_id).where(
                answers.c.class_id == row.id, answers.c.lesson == row.lesson, answers.c.step == row.step)
            return list(conn.execute(sa.select(students.c.nickname).where(
                students.c.class_id == row.id, students.c.id.not_in(answered))
                .order_by(students.c.joined_at, students.c.id)).scalars())

    def summary(self, code: object, token: object) -> list[StepSummary]:
        """Per step the class was asked, in the order first asked: answered, correct, and the choices' counts."""
        with self.engine.connect() as conn:
            row = self._teacher(conn, code, token)
            asked = conn.execute(sa.select(class_steps).where(class_steps.c.class_id == row.id)
                                 .order_by(class_steps.c.id)).all()
            got = conn.execute(sa.select(answers.c.lesson, answers.c.step, answers.c.choice, sa.func.count())
                               .where(answers.c.class_id == row.id)
                               .group_by(answers.c.lesson, answers.c.step, answers.c.choice)).all()
        counts: dict[tuple[int, int], dict[str, int]] = {}
        for lesson, step, choice, n in got:
            counts.setdefault((lesson, step), {})[choice] = int(n)
        out = []
        for a in asked:
            mine = counts.get((a.lesson, a.step), {})
            by_choice = {c: mine.get(c, 0) for c in a.choices}
            out.append(StepSummary(a.lesson, a.step, tuple(a.choices), a.answer, sum(by_choice.values()),
                                   by_choice.get(a.answer, 0), by_choice, int(a.asks)))
        return out

    def summary_csv(self, code: object, token: object) -> str:
        """The per-question summary as CSV: one row per step and choice (lesson, step, choice, right (1/0), chosen
        by, then the step's answered and correct, and how often it was asked), formula-like cells quoted."""
        out = io.StringIO()
        writer = csv.writer(out)
        writer.writerow(["lesson", "step", "choice", "right", "chosen_by", "answered", "correct", "asked"])
        for q in self.summary(code, token):
            for choice in q.choices:
                writer.writerow([q.lesson, q.step, _csv_cell(choice), int(choice == q.answer), q.counts[choice],
                                 q.answered, q.correct, q.asks])
        return out.getvalue()

    def close(self, code: object, token: object) -> None:
        with self.engine.begin() as conn:
            row = self._teacher(conn, code, token, for_update=True)
            conn.execute(classes.update().where(classes.c.id == row.id).values(closed=True))

    def export_csv(self, code: object, token: object) -> str:
        """Every recorded answer of the class, one row each: nickname, lesson, step, choice, correct (1/0), when
        (UTC, ISO 8601). Cells that a spreadsheet would read as a formula are quoted."""
        with self.engine.connect() as conn:
            row = self._teacher(conn, code, token)
            rows = conn.execute(
                sa.select(students.c.nickname, answers.c.lesson, answers.c.step, answers.c.choice, answers.c.correct,
                          answers.c.answered_at)
                .join(students, students.c.id == answers.c.student_id)
                .where(answers.c.class_id == row.id).order_by(answers.c.lesson, answers.c.step, answers.c.id)).all()
        out = io.StringIO()
        writer = csv.writer(out)
        writer.writerow(["nickname", "lesson", "step", "choice", "correct", "answered_at"])
        for name, lesson, step, choice, correct, at in rows:
            when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at))
            writer.writerow([_csv_cell(name), lesson, step, _csv_cell(choice), int(bool(correct)), when])
        return out.getvalue()


# ------------------------------------------------------------------------------------- the shared store
_store: ClassStore | None = None
_lock = threading.Lock()


def open_store(url: str | None = None) -> ClassStore:
    """A store over ``url`` (default: `database_url`), migrated to the latest schema."""
    engine = make_engine(url or database_url())
    migrate(engine)
    return ClassStore(engine)


def open_in_background(delay_s: float = 3.0) -> None:
    """Open and migrate the store in a thread ``delay_s`` after the app starts building (the page is served first:
    importing SQLAlchemy and Alembic takes ~0.3 s of a CPU the start-up needs; a class opened sooner opens the store
    itself). A failure is printed, and the first class operation tries again, with the error as its message."""

    def run() -> None:
        try:
            get_store()
        except Exception as err:  # noqa: BLE001 (reported; get_store raises it again where a user asks)
            print(f"class store not opened at start: {type(err).__name__}: {err}", flush=True)

    timer = threading.Timer(delay_s, run)
    timer.daemon = True
    timer.start()


def get_store() -> ClassStore:
    """The process's store, opened and migrated on first use (the app's start does not wait for it)."""
    global _store
    with _lock:
        if _store is None:
            try:
                _store = open_store()
            except (sa.exc.SQLAlchemyError, OSError) as err:  # a database that cannot be reached or written
                raise ClassError(f"The class store cannot be opened ({type(err).__name__}); the server's log says "
                                 "why. Classes need ATLAS_DATA writable or ATLAS_DB reachable.") from err
        return _store
