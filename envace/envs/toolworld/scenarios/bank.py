"""Bank scenarios: balance look-ups (single and parallel), transfers by id and by account name
(list_accounts → transfer), deposits, recent transactions, an insufficient-funds error path, and a
follow-up balance check after a transfer."""

from __future__ import annotations

from envace.core.json_paths import Match
from envace.envs.toolworld.domains.bank import account_history
from envace.envs.toolworld.planning import (
    PlannedTurn,
    Ref,
    Scenario,
    ScenarioInput,
)
from envace.envs.toolworld.scenarios.common import (
    call,
    enumerate_fields,
    one_step,
    phrase,
)
from envace.envs.toolworld.schema import INSUFFICIENT_FUNDS
from envace.envs.toolworld.state import sorted_ids

_TRANSFER_ANSWER = "Done: moved {amount} from {src} to {dst} ({txn}). {src} now has {from_balance}."


def _pick_accounts(inp: ScenarioInput, count: int) -> list[str]:
    return inp.rng.sample(sorted_ids(inp.state["accounts"]), count)


def _name(inp: ScenarioInput, account_id: str) -> str:
    return inp.state["accounts"][account_id]["name"]


def _check_balance(inp: ScenarioInput) -> PlannedTurn:
    (acc,) = _pick_accounts(inp, 1)
    k = inp.key("balance")
    user = phrase(
        inp,
        (
            "What's the balance of my {name} account ({acc})?",
            "How much money is in {acc}?",
            "Can you check the balance on account {acc}?",
        ),
        name=_name(inp, acc),
        acc=acc,
    )
    return PlannedTurn(
        user,
        one_step(call(k, "get_balance", account_id=acc)),
        "Your account {acc} has a balance of {balance}.",
        {"acc": acc, "balance": Ref(k, ("balance",))},
        ("balance",),
    )


def _compare_balances(inp: ScenarioInput) -> PlannedTurn:
    a, b = _pick_accounts(inp, 2)
    ka, kb = inp.key("balance_a"), inp.key("balance_b")
    user = phrase(
        inp,
        (
            "How much is in {a} and in {b}?",
            "Please check the balances of {a} and {b}.",
            "What are the balances of accounts {a} and {b}?",
        ),
        a=a,
        b=b,
    )
    steps = ((call(ka, "get_balance", account_id=a), call(kb, "get_balance", account_id=b)),)
    fields = {"a": a, "b": b, "bal_a": Ref(ka, ("balance",)), "bal_b": Ref(kb, ("balance",))}
    return PlannedTurn(user, steps, "{a} has {bal_a} and {b} has {bal_b}.", fields, ("bal_a", "bal_b"))


def _amount_within(inp: ScenarioInput, account_id: str) -> int | None:
    balance = inp.state["accounts"][account_id]["balance"]
    if balance < 10:
        return None
    return inp.rng.randrange(10, min(balance, 500) + 1, 10)


def _transfer(inp: ScenarioInput) -> PlannedTurn | None:
    src, dst = _pick_accounts(inp, 2)
    amount = _amount_within(inp, src)
    if amount is None:
        return None
    k = inp.key("transfer")
    user = phrase(
        inp,
        (
            "Please transfer {amount} from {src} to {dst}.",
            "Move {amount} from account {src} into {dst}.",
            "Send {amount} from {src} to {dst}, please.",
        ),
        amount=amount,
        src=src,
        dst=dst,
    )
    fields = {
        "amount": amount,
        "src": src,
        "dst": dst,
        "txn": Ref(k, ("transaction_id",)),
        "from_balance": Ref(k, ("from_balance",)),
    }
    return PlannedTurn(
        user,
        one_step(call(k, "transfer", from_account_id=src, to_account_id=dst, amount=amount)),
        _TRANSFER_ANSWER,
        fields,
        ("txn", "from_balance"),
        {"transfer": {"dst": dst, "dst_name": _name(inp, dst)}},
    )


def _transfer_by_name(inp: ScenarioInput) -> PlannedTurn | None:
    src, dst = _pick_accounts(inp, 2)
    amount = _amount_within(inp, src)
    if amount is None:
        return None
    kl, kt = inp.key("accounts"), inp.key("transfer")
    src_name, dst_name = _name(inp, src), _name(inp, dst)
    user = phrase(
        inp,
        (
            "Transfer {amount} from my {s} account to my {d} account.",
            "Please move {amount} from {s} to {d}.",
            "Can you send {amount} from my {s} to my {d} account?",
        ),
        amount=amount,
        s=src_name,
        d=dst_name,
    )
    src_ref = Ref(kl, ("accounts", Match.of(name=src_name), "account_id"))
    dst_ref = Ref(kl, ("accounts", Match.of(name=dst_name), "account_id"))
    steps = (
        (call(kl, "list_accounts"),),
        (call(kt, "transfer", from_account_id=src_ref, to_account_id=dst_ref, amount=amount),),
    )
    fields = {
        "amount": amount,
        "src": src_ref,
        "dst": dst_ref,
        "txn": Ref(kt, ("transaction_id",)),
        "from_balance": Ref(kt, ("from_balance",)),
    }
    return PlannedTurn(
        user, steps, _TRANSFER_ANSWER, fields, ("txn", "from_balance"), {"transfer": {"dst": dst, "dst_name": dst_name}}
    )


def _deposit(inp: ScenarioInput) -> PlannedTurn:
    (acc,) = _pick_accounts(inp, 1)
    amount = inp.rng.randrange(50, 1000, 10)
    k = inp.key("deposit")
    user = phrase(
        inp,
        (
            "Deposit {amount} into {acc}.",
            "Please put {amount} into my {name} account ({acc}).",
            "Add a deposit of {amount} to account {acc}.",
        ),
        amount=amount,
        acc=acc,
        name=_name(inp, acc),
    )
    fields = {"amount": amount, "acc": acc, "txn": Ref(k, ("transaction_id",)), "balance": Ref(k, ("balance",))}
    return PlannedTurn(
        user,
        one_step(call(k, "deposit", account_id=acc, amount=amount)),
        "Deposited {amount} into {acc} ({txn}). New balance: {balance}.",
        fields,
        ("txn", "balance"),
    )


def _recent_transactions(inp: ScenarioInput) -> PlannedTurn:
    (acc,) = _pick_accounts(inp, 1)
    limit = inp.rng.choice((2, 3))
    k = inp.key("history")
    if limit == 3:
        user = phrase(
            inp, ("Show me the recent transactions on {acc}.", "What happened on account {acc} lately?"), acc=acc
        )
        planned = call(k, "get_transactions", account_id=acc)
    else:
        user = phrase(
            inp, ("Show my last 2 transactions on {acc}.", "What were the last two transactions on {acc}?"), acc=acc
        )
        planned = call(k, "get_transactions", account_id=acc, limit=limit)
    rows = account_history(dict(inp.state), acc, limit)
    if not rows:
        return PlannedTurn(
            user, one_step(planned), "There are no recent transactions on {acc}.", {"acc": acc}, ("acc",)
        )
    listing = "; ".join(f"{r['transaction_id']} {r['kind']} {r['amount']}" for r in rows)
    fields = {"acc": acc, "listing": listing, **enumerate_fields("txn", [r["transaction_id"] for r in rows])}
    keys = tuple(f"txn_{i}" for i in range(len(rows)))
    return PlannedTurn(user, one_step(planned), "Recent transactions on {acc}: {listing}.", fields, keys)


def _failed_transfer(inp: ScenarioInput) -> PlannedTurn:
    src, dst = _pick_accounts(inp, 2)
    balance = inp.state["accounts"][src]["balance"]
    amount = balance + inp.rng.randrange(10, 500, 10)
    user = phrase(
        inp,
        ("Please transfer {amount} from {src} to {dst}.", "Send {amount} from {src} to {dst}."),
        amount=amount,
        src=src,
        dst=dst,
    )
    planned = call(
        inp.key("transfer"), "transfer", INSUFFICIENT_FUNDS, from_account_id=src, to_account_id=dst, amount=amount
    )
    return PlannedTurn(
        user,
        one_step(planned),
        "I couldn't make that transfer: {src} only has {balance}.",
        {"src": src, "balance": balance},
        ("balance",),
    )


def _balance_follow_up(inp: ScenarioInput) -> PlannedTurn:
    prev = inp.context["transfer"]
    k = inp.key("balance")
    user = phrase(
        inp,
        ("And what's the balance of my {name} account ({acc}) now?", "How much is in {acc} now?"),
        name=prev["dst_name"],
        acc=prev["dst"],
    )
    return PlannedTurn(
        user,
        one_step(call(k, "get_balance", account_id=prev["dst"])),
        "{acc} now has {balance}.",
        {"acc": prev["dst"], "balance": Ref(k, ("balance",))},
        ("balance",),
    )


SCENARIOS: tuple[Scenario, ...] = (
    Scenario("check_balance", ("get_balance",), _check_balance),
    Scenario("compare_balances", ("get_balance",), _compare_balances),
    Scenario("transfer", ("transfer",), _transfer, provides=("transfer",)),
    Scenario("transfer_by_name", ("list_accounts", "transfer"), _transfer_by_name, provides=("transfer",)),
    Scenario("deposit", ("deposit",), _deposit),
    Scenario("recent_transactions", ("get_transactions",), _recent_transactions),
    Scenario("failed_transfer", ("transfer",), _failed_transfer),
    Scenario("balance_after_transfer", ("get_balance",), _balance_follow_up, requires="transfer"),
)
