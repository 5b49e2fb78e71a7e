"""Bank domain: accounts with integer balances and a transaction ledger.

State: ``{"accounts": {acc_id: {"name", "balance"}}, "transactions": [{"transaction_id", "kind",
"from_account", "to_account", "amount"}], "next_ids": {"txn": n}}``. ``kind`` is ``deposit`` (no
``from_account``) or ``transfer``. Amounts are whole currency units (integers).
"""

from __future__ import annotations

import random
from typing import Any

from envace.envs.toolworld.schema import (
    INSUFFICIENT_FUNDS,
    INVALID_VALUE,
    NOT_FOUND,
    Param,
    ToolError,
    ToolSpec,
)
from envace.envs.toolworld.state import allocate_id, id_order, sorted_ids

NAME = "bank"
DESCRIPTION = "personal banking: account balances, transfers, deposits and recent transactions"
ACCOUNT_NAMES = ("checking", "savings", "travel", "emergency", "holiday", "rent")


def account(state: dict[str, Any], account_id: str) -> dict[str, Any]:
    found = state["accounts"].get(account_id)
    if found is None:
        raise ToolError(NOT_FOUND, f"no account with id '{account_id}'")
    return found


def account_history(state: dict[str, Any], account_id: str, limit: int) -> list[dict[str, Any]]:
    """Newest-first ledger entries touching ``account_id``, as ``get_transactions`` reports them."""
    rows = []
    for txn in sorted(state["transactions"], key=lambda t: id_order(t["transaction_id"]), reverse=True):
        if txn["kind"] == "deposit" and txn["to_account"] == account_id:
            kind = "deposit"
        elif txn["kind"] == "transfer" and account_id in (txn["from_account"], txn["to_account"]):
            kind = "transfer_out" if txn["from_account"] == account_id else "transfer_in"
        else:
            continue
        rows.append({"transaction_id": txn["transaction_id"], "kind": kind, "amount": txn["amount"]})
    return rows[:limit]


def _list_accounts(state: dict[str, Any], args: dict[str, Any]) -> dict[str, Any]:
    accounts = state["accounts"]
    return {
        "accounts": [
            {"account_id": k, "name": accounts[k]["name"], "balance": accounts[k]["balance"]}
            for k in sorted_ids(accounts)
        ]
    }


def _get_balance(state: dict[str, Any], args: dict[str, Any]) -> dict[str, Any]:
    return {"account_id": args["account_id"], "balance": account(state, args["account_id"])["balance"]}


def _transfer(state: dict[str, Any], args: dict[str, Any]) -> dict[str, Any]:
    src_id, dst_id, amount = args["from_account_id"], args["to_account_id"], args["amount"]
    src, dst = account(state, src_id), account(state, dst_id)
    if src_id == dst_id:
        raise ToolError(INVALID_VALUE, "from_account_id and to_account_id must differ")
    if src["balance"] < amount:
        raise ToolError(INSUFFICIENT_FUNDS, f"account {src_id} has balance {src['balance']}, less than {amount}")
    src["balance"] -= amount
    dst["balance"] += amount
    txn_id = allocate_id(state, "txn")
    state["transactions"].append(
        {"transaction_id": txn_id, "kind": "transfer", "from_account": src_id, "to_account": dst_id, "amount": amount}
    )
    return {"transaction_id": txn_id, "from_balance": src["balance"], "to_balance": dst["balance"]}


def _deposit(state: dict[str, Any], args: dict[str, Any]) -> dict[str, Any]:
    target = account(state, args["account_id"])
    target["balance"] += args["amount"]
    txn_id = allocate_id(state, "txn")
    state["transactions"].append(
        {
            "transaction_id": txn_id,
            "kind": "deposit",
            "from_account": None,
            "to_account": args["account_id"],
            "amount": args["amount"],
        }
    )
    return {"transaction_id": txn_id, "balance": target["balance"]}


def _get_transactions(state: dict[str, Any], args: dict[str, Any]) -> dict[str, Any]:
    account(state, args["account_id"])
    return {"account_id": args["account_id"], "transactions": account_history(state, args["account_id"], args["limit"])}


_ACCOUNT_ID = Param("account_id", "string", "Account id, e.g. acc_1.")
_AMOUNT = Param("amount", "integer", "Amount in whole currency units.", minimum=1)

TOOLS: tuple[ToolSpec, ...] = (
    ToolSpec("list_accounts", NAME, "List the user's accounts with ids, names and balances.", (), _list_accounts),
    ToolSpec("get_balance", NAME, "Get the current balance of one account.", (_ACCOUNT_ID,), _get_balance),
    ToolSpec(
        "transfer",
        NAME,
        "Move money from one of the user's accounts to another.",
        (
            Param("from_account_id", "string", "Account id to take the money from."),
            Param("to_account_id", "string", "Account id to put the money into."),
            _AMOUNT,
        ),
        _transfer,
    ),
    ToolSpec("deposit", NAME, "Deposit money into an account.", (_ACCOUNT_ID, _AMOUNT), _deposit),
    ToolSpec(
        "get_transactions",
        NAME,
        "List the most recent transactions of an account, newest first.",
        (
            _ACCOUNT_ID,
            Param("limit", "integer", "How many to return.", required=False, minimum=1, maximum=10, default=3),
        ),
        _get_transactions,
    ),
)


def seed_state(rng: random.Random) -> dict[str, Any]:
    """Three accounts with random names and balances, and a short past ledger."""
    names = rng.sample(ACCOUNT_NAMES, 3)
    accounts = {f"acc_{i + 1}": {"name": n, "balance": rng.randrange(200, 3000, 10)} for i, n in enumerate(names)}
    ids = list(accounts)
    transactions = []
    for number in range(1, rng.randint(2, 4) + 1):
        amount = rng.randrange(20, 400, 10)
        if rng.random() < 0.5:
            src, dst = rng.sample(ids, 2)
            transactions.append(
                {
                    "transaction_id": f"txn_{number}",
                    "kind": "transfer",
                    "from_account": src,
                    "to_account": dst,
                    "amount": amount,
                }
            )
        else:
            transactions.append(
                {
                    "transaction_id": f"txn_{number}",
                    "kind": "deposit",
                    "from_account": None,
                    "to_account": rng.choice(ids),
                    "amount": amount,
                }
            )
    return {"accounts": accounts, "transactions": transactions, "next_ids": {"txn": len(transactions) + 1}}
