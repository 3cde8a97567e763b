"""The class store (serving/classroom.py, issue 51): every operation and every rule of "who may do what", on SQLite
always and on a throwaway PostgreSQL server when one can be started (tests/pg.py; skipped with the reason
otherwise)."""

from __future__ import annotations

import csv
import io
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from serving import classroom as cr
from tests import pg

CHOICES = ["t0", "t1", "t2", "t3"]


class Clock:
    """A clock the test moves by hand (expiry, the rate limit's minute)."""

    def __init__(self, now: float = 1_800_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture(scope="session")
def postgres() -> Iterator[str]:
    server, why = pg.start()
    if server is None:
        pytest.skip(f"PostgreSQL not available: {why}")
    yield server.url
    server.stop()


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'atlas.sqlite3'}"
    return request.getfixturevalue("postgres")


@pytest.fixture()
def clock() -> Clock:
    return Clock()


@pytest.fixture()
def store(url: str, clock: Clock) -> Iterator[cr.ClassStore]:
    engine = cr.make_engine(url)
    cr.migrate(engine)
    yield cr.ClassStore(engine, clock=clock)
    engine.dispose()


def opened(store: cr.ClassStore) -> cr.Opened:
    return store.open(4, 2, CHOICES, "t2", "0")


# ------------------------------------------------------------------------------------------- the operations
def test_migrations_build_exactly_the_declared_schema(url: str) -> None:
    """Alembic's upgrade gives the tables the code declares (autogenerate finds no difference) and is idempotent."""
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    engine = cr.make_engine(url)
    cr.migrate(engine)
    cr.migrate(engine)  # a second start changes nothing
    with engine.connect() as conn:
        assert conn.execute(sa.text("select version_num from alembic_version")).scalar_one() == "0002"
        diff = compare_metadata(MigrationContext.configure(conn), cr.metadata)
    engine.dispose()
    assert diff == []


def test_a_class_from_open_to_close(store: cr.ClassStore) -> None:
    o = opened(store)
    assert len(o.code) == cr.CODE_LENGTH and set(o.code) <= set(cr.CODE_ALPHABET)
    assert len(o.token) >= 43  # token_urlsafe(32): 256 bits
    joined = [store.join(o.code.lower(), f"student {i}", "10.0.0.1") for i in range(5)]  # any case
    picks = ["t0", "t2", "t2", "t3", "t2"]
    for j, p in zip(joined, picks, strict=True):
        assert store.answer(j.token, 4, 2, p) == p
    state = store.state(o.code)
    assert state.counts == {"t0": 1, "t1": 0, "t2": 3, "t3": 1} and state.students == 5 and state.answered == 5
    assert state.answer is None and not state.revealed  # the room does not get the answer before the reveal
    assert store.teacher_state(o.code, o.token).answer == "t2"
    _, name, mine = store.student_state(joined[3].token)
    assert (name, mine) == ("student 3", "t3")

    revealed = store.reveal(o.code, o.token)
    assert revealed.revealed and store.state(o.code).answer == "t2"
    moved = store.advance(o.code, o.token, 4, 3, ["a", "b", "c"], "c", "0")
    assert (moved.lesson, moved.step, moved.revealed, moved.choices) == (4, 3, False, ("a", "b", "c"))
    assert moved.counts == {"a": 0, "b": 0, "c": 0}  # a new step starts empty
    store.answer(joined[0].token, 4, 3, "c")

    rows = list(csv.reader(io.StringIO(store.export_csv(o.code, o.token))))
    assert rows[0] == ["nickname", "lesson", "step", "choice", "correct", "answered_at"]
    got = sorted((r[0], r[2], r[3], r[4]) for r in rows[1:])
    want = sorted([(f"student {i}", "2", p, str(int(p == "t2"))) for i, p in enumerate(picks)]
                  + [("student 0", "3", "c", "1")])
    assert got == want

    store.close(o.code, o.token)
    for act in (lambda: store.state(o.code), lambda: store.join(o.code, "late", "10.0.0.2"),
                lambda: store.answer(joined[1].token, 4, 3, "a")):
        with pytest.raises(cr.ClassError, match="closed"):
            act()


def test_answers_survive_a_new_process(url: str, clock: Clock) -> None:
    """Everything is in the database: a store over a fresh engine (a restarted server) sees the same class."""
    first = cr.ClassStore(cr.make_engine(url), clock=clock)
    cr.migrate(first.engine)
    o = opened(first)
    for i in range(3):
        first.answer(first.join(o.code, f"s{i}", "ip").token, 4, 2, CHOICES[i])
    first.engine.dispose()
    again = cr.ClassStore(cr.make_engine(url), clock=clock)
    cr.migrate(again.engine)
    assert again.teacher_state(o.code, o.token).counts == {"t0": 1, "t1": 1, "t2": 1, "t3": 0}
    again.engine.dispose()


def test_a_burst_of_answers_loses_none(store: cr.ClassStore) -> None:
    """40 students answer at the same moment from 40 threads: every answer is counted once."""
    o = opened(store)
    joined = [store.join(o.code, f"s{i}", "ip") for i in range(40)]
    barrier = threading.Barrier(len(joined))
    errors: list[BaseException] = []

    def go(i: int) -> None:
        barrier.wait()
        try:
            store.answer(joined[i].token, 4, 2, CHOICES[i % 4])
        except BaseException as err:  # noqa: BLE001 (reported below)
            errors.append(err)

    threads = [threading.Thread(target=go, args=(i,)) for i in range(len(joined))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert store.state(o.code).counts == {c: 10 for c in CHOICES}


# ------------------------------------------------------------------------------------------ who may do what
def test_unknown_malformed_and_expired_codes(store: cr.ClassStore, clock: Clock) -> None:
    o = opened(store)
    missing = next(c for c in ("222222", "333333", "444444") if c != o.code)
    with pytest.raises(cr.ClassError, match="No class has this join code"):
        store.join(missing, "ann", "ip")
    for bad in ("", "12", "0OIL10", "ABCDEFG", None, "x" * 10_000):
        with pytest.raises(cr.ClassError, match="join code is 6"):
            store.join(bad, "ann", "ip2")
    j = store.join(o.code, "ann", "ip3")
    clock.now += cr.LIFETIME_S  # a day later
    for act in (lambda: store.join(o.code, "bob", "ip3"), lambda: store.answer(j.token, 4, 2, "t0"),
                lambda: store.reveal(o.code, o.token), lambda: store.state(o.code)):
        with pytest.raises(cr.ClassError, match="expired"):
            act()
    clock.now -= cr.LIFETIME_S
    assert store.state(o.code).answered == 0  # the refused answer changed nothing


def test_a_replayed_answer_changes_nothing(store: cr.ClassStore) -> None:
    o = opened(store)
    j = store.join(o.code, "ann", "ip")
    store.answer(j.token, 4, 2, "t1")
    for again in ("t1", "t2"):
        with pytest.raises(cr.ClassError, match="first answer .* is recorded"):
            store.answer(j.token, 4, 2, again)
    assert store.state(o.code).counts == {"t0": 0, "t1": 1, "t2": 0, "t3": 0}
    # neither a choice the step does not offer, another step than the class's, nor an unknown student
    for token, lesson, step, choice, why in ((j.token, 4, 2, "t9", "not one of"), (j.token, 4, 3, "t1", "is on"),
                                             ("forged", 4, 2, "t1", "Join the class first")):
        with pytest.raises(cr.ClassError, match=why):
            store.answer(token, lesson, step, choice)
    store.reveal(o.code, o.token)
    late = store.join(o.code, "late", "ip")
    with pytest.raises(cr.ClassError, match="revealed"):
        store.answer(late.token, 4, 2, "t2")
    assert store.state(o.code).answered == 1


def test_a_forged_teacher_token_can_do_nothing(store: cr.ClassStore) -> None:
    o = opened(store)
    other = opened(store)
    j = store.join(o.code, "ann", "ip")
    forged = [o.token[:-1] + ("A" if o.token[-1] != "A" else "B"), "", None, other.token, j.token, "x" * 10_000]
    for token in forged:
        for act, args in ((store.reveal, ()), (store.close, ()), (store.export_csv, ()), (store.teacher_state, ()),
                          (store.advance, (1, 1, ["a", "b"], "a")), (store.missing, ()), (store.reask, ()),
                          (store.summary, ()), (store.summary_csv, ())):
            with pytest.raises(cr.ClassError, match="Only the teacher link"):
                act(o.code, token, *args)
    state = store.teacher_state(o.code, o.token)
    assert (state.lesson, state.step, state.revealed, state.closed) == (4, 2, False, False)
    with store.engine.connect() as conn:  # only the token's hash is stored
        stored = conn.execute(sa.select(cr.classes.c.teacher_hash).where(cr.classes.c.code == o.code)).scalar_one()
    assert o.token not in stored and stored == cr._hash(o.token)


def test_nicknames_are_plain_short_text(store: cr.ClassStore) -> None:
    o = opened(store)
    for bad, why in (("x" * 10_000, "at most 32"), ("y" * 33, "at most 32"), ("", "Type a nickname"),
                     ("  \u200b\u202e\x00 ", "Type a nickname"), (None, "Type a nickname")):
        with pytest.raises(cr.ClassError, match=why):
            store.join(o.code, bad, "ip")
    assert store.state(o.code).students == 0  # nothing was stored
    j = store.join(o.code, "  Ann\u202e\x07 <b>", "ip")  # controls and direction overrides go; markup stays text
    assert j.nickname == "Ann <b>"
    assert store.student_state(j.token)[1] == "Ann <b>"
    assert store.join(o.code, "z" * 32, "ip").nickname == "z" * 32


def test_students_see_counts_never_nicknames(store: cr.ClassStore) -> None:
    o = opened(store)
    a = store.join(o.code, "Alice Secret", "ip")
    b = store.join(o.code, "Bob Hidden", "ip")
    store.answer(a.token, 4, 2, "t0")
    seen = repr(store.student_state(b.token)) + repr(store.state(o.code))
    assert "Alice" not in seen and "Bob Hidden" in repr(store.student_state(b.token))
    assert "Alice" in store.export_csv(o.code, o.token)  # the teacher's export names them


def test_csv_cells_are_not_formulas(store: cr.ClassStore) -> None:
    o = store.open(1, 1, ["=1+1", "b"], "b")
    j = store.join(o.code, "=HYPERLINK(\"x\")", "ip")
    store.answer(j.token, 1, 1, "=1+1")
    row = list(csv.reader(io.StringIO(store.export_csv(o.code, o.token))))[1]
    assert row[0] == "'=HYPERLINK(\"x\")" and row[3] == "'=1+1"


def test_wrong_codes_are_rate_limited_per_address(store: cr.ClassStore, clock: Clock) -> None:
    """A burst of `JOIN_FAILS_BURST` wrong codes from one address passes (a room of 100 behind one NAT, each student
    mistyping once); after it the address gets `JOIN_FAILS_PER_MINUTE` more a minute, so a guesser's day holds as
    many guesses as before (module docstring)."""
    o = opened(store)
    missing = next(c for c in ("222222", "333333") if c != o.code)
    for _ in range(cr.JOIN_FAILS_BURST):
        with pytest.raises(cr.ClassError, match="No class"):
            store.join(missing, "guess", "6.6.6.6")
    with pytest.raises(cr.ClassError, match="Too many wrong join codes"):  # even the right code, now
        store.join(o.code, "guess", "6.6.6.6")
    assert store.join(o.code, "neighbour", "7.7.7.7").nickname == "neighbour"  # other addresses are not held up
    clock.now += 60 / cr.JOIN_FAILS_PER_MINUTE + 0.01  # one more try has been earned back
    assert store.join(o.code, "guess", "6.6.6.6").nickname == "guess"
    with pytest.raises(cr.ClassError, match="No class"):
        store.join(missing, "guess", "6.6.6.6")
    with pytest.raises(cr.ClassError, match="Too many wrong join codes from your network: try again in [0-9]+ s"):
        store.join(missing, "guess", "6.6.6.6")
    clock.now += 3600  # an hour later the whole burst is back
    for _ in range(cr.JOIN_FAILS_BURST):
        with pytest.raises(cr.ClassError, match="No class"):
            store.join(missing, "guess", "6.6.6.6")
    assert store.state(o.code).students == 2


def test_a_room_behind_one_address_joins_despite_typos(store: cr.ClassStore) -> None:
    """100 students behind one NAT: every one mistypes once (a well-formed wrong code), some type something that is
    not a code at all (which cannot hit any class, so it is not counted), then all join with the right code."""
    assert cr.JOIN_FAILS_BURST >= 100
    o = opened(store)
    missing = next(c for c in ("222222", "333333") if c != o.code)
    for i in range(100):
        with pytest.raises(cr.ClassError, match="No class"):
            store.join(missing, f"s{i}", "10.0.0.1")
        with pytest.raises(cr.ClassError, match="A join code is 6"):
            store.join(o.code[:5], f"s{i}", "10.0.0.1")
        assert store.join(o.code, f"s{i}", "10.0.0.1").nickname == f"s{i}"
    assert store.state(o.code).students == 100


def test_a_class_holds_at_most_500(store: cr.ClassStore, monkeypatch) -> None:
    o = opened(store)
    with store.engine.begin() as conn:  # 499 students already in (inserted directly: the cap is what is tested)
        class_id = conn.execute(sa.select(cr.classes.c.id).where(cr.classes.c.code == o.code)).scalar_one()
        conn.execute(cr.students.insert(), [{"class_id": class_id, "token_hash": f"{o.code}{i:058d}",
                                             "nickname": f"s{i}", "joined_at": 0.0} for i in range(499)])
    assert store.join(o.code, "the 500th", "ip").nickname == "the 500th"
    with pytest.raises(cr.ClassError, match="full .500"):
        store.join(o.code, "the 501st", "ip")
    assert store.state(o.code).students == cr.MAX_STUDENTS == 500


def test_the_cap_holds_when_joins_race(store: cr.ClassStore, monkeypatch) -> None:
    """20 students join at the same moment a class of 5: exactly 5 get in."""
    monkeypatch.setattr(cr, "MAX_STUDENTS", 5)
    o = opened(store)
    barrier = threading.Barrier(20)
    results: list[str] = []

    def go(i: int) -> None:
        barrier.wait()
        try:
            store.join(o.code, f"s{i}", "ip")
            results.append("in")
        except cr.ClassError as err:
            results.append(str(err))

    threads = [threading.Thread(target=go, args=(i,)) for i in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results.count("in") == 5 and store.state(o.code).students == 5
    assert all("full" in r for r in results if r != "in")


def test_where_the_database_lives(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.delenv("ATLAS_DB", raising=False)
    monkeypatch.setenv("ATLAS_DATA", str(tmp_path / "here"))
    assert cr.database_url() == f"sqlite:///{tmp_path / 'here' / 'atlas.sqlite3'}"
    monkeypatch.setenv("ATLAS_DB", "postgresql://u:p@db.example/atlas")
    assert cr.database_url() == "postgresql+psycopg://u:p@db.example/atlas"
    monkeypatch.delenv("ATLAS_DB")
    monkeypatch.delenv("ATLAS_DATA")
    want = Path("/data") if os.path.isdir("/data") and os.access("/data", os.W_OK) else cr.ROOT / "data"
    assert cr.data_dir() == want


def test_a_store_that_cannot_be_opened_is_a_message(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setattr(cr, "_store", None)
    monkeypatch.setenv("ATLAS_DB", "postgresql://nobody@127.0.0.1:1/none")  # nothing listens on port 1
    with pytest.raises(cr.ClassError, match="class store cannot be opened"):
        cr.get_store()
    monkeypatch.delenv("ATLAS_DB")
    monkeypatch.setenv("ATLAS_DATA", str(tmp_path))
    assert cr.get_store().state  # and the next use, with a reachable database, opens it
    assert (tmp_path / "atlas.sqlite3").is_file()


def test_ended_classes_are_deleted_with_their_students_and_answers(store: cr.ClassStore, clock: Clock) -> None:
    """A closed or expired class can no longer be read by anyone; opening the next class deletes its rows."""
    closed, expiring = opened(store), opened(store)
    for o in (closed, expiring):
        store.answer(store.join(o.code, "gone soon", "ip").token, 4, 2, "t0")
    store.close(closed.code, closed.token)

    def ids_of(*codes: str) -> list[int]:
        with store.engine.connect() as conn:
            return list(conn.execute(sa.select(cr.classes.c.id).where(cr.classes.c.code.in_(codes))).scalars())

    ids = ids_of(closed.code, expiring.code)  # this test's classes (a PostgreSQL database is shared by the tests)

    def rows() -> tuple[int, int, int]:
        with store.engine.connect() as conn:
            return tuple(conn.execute(sa.select(sa.func.count()).select_from(t).where(column.in_(ids))).scalar_one()
                         for t, column in ((cr.classes, cr.classes.c.id), (cr.students, cr.students.c.class_id),
                                           (cr.answers, cr.answers.c.class_id)))

    assert rows() == (2, 2, 2)
    clock.now += cr.LIFETIME_S - 1
    kept = opened(store)  # purges the closed class; the other has a second left
    ids += ids_of(kept.code)
    store.join(kept.code, "stays", "ip")
    assert rows() == (2, 2, 1)
    clock.now += 1  # the second class's day is over
    assert store.purge() >= 1 and rows() == (1, 1, 0)
    assert store.state(kept.code).students == 1


# ------------------------------------------------------------------------------------- what teachers asked for
def test_who_has_not_answered_is_the_teachers_alone(store: cr.ClassStore) -> None:
    """Issue 61, item 11: the teacher sees the nicknames of the joined students without an answer to the current
    step (in the order they joined); a new step starts with everybody missing again."""
    o = opened(store)
    ann, bob, cy = (store.join(o.code, name, "ip") for name in ("ann", "bob", "cy"))
    assert store.missing(o.code, o.token) == ["ann", "bob", "cy"]
    store.answer(bob.token, 4, 2, "t1")
    assert store.missing(o.code, o.token) == ["ann", "cy"]
    store.answer(ann.token, 4, 2, "t2")
    store.answer(cy.token, 4, 2, "t0")
    assert store.missing(o.code, o.token) == []
    store.advance(o.code, o.token, 4, 3, ["a", "b"], "a", "0")
    assert store.missing(o.code, o.token) == ["ann", "bob", "cy"]
    other = opened(store)  # another class's students are not this class's
    store.join(other.code, "dee", "ip")
    assert store.missing(o.code, o.token) == ["ann", "bob", "cy"] and store.missing(other.code, other.token) == ["dee"]


def test_a_step_asked_again_clears_its_answers_for_the_class(store: cr.ClassStore) -> None:
    """Issue 61, item 11: re-asking a step deletes the class's answers to it and its reveal; students answer again
    (their first answer to the step was refused a second time before); other steps and classes keep theirs."""
    o, other = opened(store), opened(store)
    ann, bob = store.join(o.code, "ann", "ip"), store.join(o.code, "bob", "ip")
    dee = store.join(other.code, "dee", "ip")
    store.answer(dee.token, 4, 2, "t0")
    store.answer(ann.token, 4, 2, "t0")
    store.answer(bob.token, 4, 2, "t2")
    store.reveal(o.code, o.token)
    with pytest.raises(cr.ClassError, match="revealed"):
        store.answer(ann.token, 4, 2, "t2")
    again = store.reask(o.code, o.token)
    assert not again.revealed and again.answered == 0 and again.counts == {c: 0 for c in CHOICES}
    assert store.state(o.code).answer is None  # the room loses the answer again until the next reveal
    assert store.answer(ann.token, 4, 2, "t2") == "t2"  # answered anew
    assert store.state(o.code).counts == {"t0": 0, "t1": 0, "t2": 1, "t3": 0}
    assert store.state(other.code).answered == 1  # another class is not touched
    assert store.missing(o.code, o.token) == ["bob"]


def test_the_summary_per_question_counts_every_step_asked(store: cr.ClassStore) -> None:
    """Issue 61, item 11: after class, per step: answered, correct, and how many chose each choice (choices nobody
    chose included), in the teacher's view and as CSV."""
    o = opened(store)
    names = ["ann", "bob", "cy", "dee"]
    joined = [store.join(o.code, n, "ip") for n in names]
    for j, pick in zip(joined, ["t2", "t2", "t0", "t3"], strict=True):
        store.answer(j.token, 4, 2, pick)
    store.advance(o.code, o.token, 4, 3, ["a", "=cmd", "c"], "=cmd", "0")
    for j, pick in zip(joined[:3], ["=cmd", "a", "=cmd"], strict=True):
        store.answer(j.token, 4, 3, pick)
    store.advance(o.code, o.token, 5, 1, ["x", "y"], "y", "")  # asked, nobody answered yet
    first, second, third = store.summary(o.code, o.token)
    assert (first.lesson, first.step, first.answered, first.correct) == (4, 2, 4, 2)
    assert first.counts == {"t0": 1, "t1": 0, "t2": 2, "t3": 1} and first.answer == "t2"
    assert (second.answered, second.correct, second.counts) == (3, 2, {"a": 1, "=cmd": 2, "c": 0})
    assert (third.lesson, third.step, third.answered, third.correct) == (5, 1, 0, 0)
    store.advance(o.code, o.token, 4, 2, CHOICES, "t2", "0")  # back to the first step: the same question
    store.reask(o.code, o.token)
    store.answer(joined[0].token, 4, 2, "t1")
    again = store.summary(o.code, o.token)
    assert [(q.lesson, q.step) for q in again] == [(4, 2), (4, 3), (5, 1)]  # the order first asked
    assert (again[0].answered, again[0].correct, again[0].asks) == (1, 0, 2)
    rows = list(csv.reader(io.StringIO(store.summary_csv(o.code, o.token))))
    assert rows[0] == ["lesson", "step", "choice", "right", "chosen_by", "answered", "correct", "asked"]
    assert ["4", "3", "'=cmd", "1", "2", "3", "2", "1"] in rows  # a formula-like choice is quoted
    assert ["4", "2", "t1", "0", "1", "1", "0", "2"] in rows and len(rows) == 1 + 4 + 3 + 2


def test_the_same_step_with_another_input_starts_afresh(store: cr.ClassStore) -> None:
    """A class moved to a step it answered before, but on another input (other choices, another answer): the old
    answers were to other choices, so they go and the room answers the new question."""
    o = opened(store)
    ann = store.join(o.code, "ann", "ip")
    store.answer(ann.token, 4, 2, "t2")
    store.advance(o.code, o.token, 4, 2, ["u0", "u1"], "u1", "7")
    assert store.state(o.code).counts == {"u0": 0, "u1": 0}
    assert store.answer(ann.token, 4, 2, "u1") == "u1"
    (only,) = store.summary(o.code, o.token)
    assert only.choices == ("u0", "u1") and (only.answered, only.correct) == (1, 1)


def test_the_presenter_token_reads_what_the_room_sees_and_nothing_more(store: cr.ClassStore) -> None:
    """Issue 75, item 2: the presenter token is the teacher's to hand out; it reads the class as the room sees it
    (no answer before the reveal, no nickname) and does nothing else; a forged one, another class's, the teacher
    token itself or a student's is refused; nothing new is stored."""
    o, other = opened(store), opened(store)
    token = store.presenter_token(o.code, o.token)
    assert len(token) == 32 and token not in (o.token, store.presenter_token(other.code, other.token))
    assert store.presenter_token(o.code.lower(), o.token) == token  # derived, the same every time
    with pytest.raises(cr.ClassError, match="Only the teacher link"):
        store.presenter_token(o.code, token)  # a presenter cannot mint tokens
    j = store.join(o.code, "ann", "ip")
    store.answer(j.token, 4, 2, "t1")
    seen = store.presenter_state(o.code, token)
    assert (seen.lesson, seen.step, seen.revealed, seen.answer, seen.students) == (4, 2, False, None, 1)
    assert seen.counts == {"t0": 0, "t1": 1, "t2": 0, "t3": 0}
    assert "ann" not in repr(seen)
    forged = [token[:-1] + ("0" if token[-1] != "0" else "1"), "", None, o.token, j.token,
              store.presenter_token(other.code, other.token), "x" * 10_000]
    for bad in forged:
        with pytest.raises(cr.ClassError, match="presenter link is not the class's"):
            store.presenter_state(o.code, bad)
    for bad in (token, *forged[:3]):  # the presenter token is no teacher link
        for act, args in ((store.reveal, ()), (store.close, ()), (store.export_csv, ()), (store.missing, ()),
                          (store.advance, (1, 1, ["a", "b"], "a"))):
            with pytest.raises(cr.ClassError, match="Only the teacher link"):
                act(o.code, bad, *args)
    store.reveal(o.code, o.token)
    assert store.presenter_state(o.code, token).answer == "t2"  # the answer once revealed, as every page
    store.close(o.code, o.token)
    with pytest.raises(cr.ClassError, match="closed"):
        store.presenter_state(o.code, token)
    with store.engine.connect() as conn:  # nothing of the token is stored
        rows = [tuple(r) for r in conn.execute(sa.select(cr.classes)).all()]
    assert token not in repr(rows)
