/*
 * readonly.c: read-only sessions, as the original's tsdb_admin extension
 * has them. tsdb_admin.read_only_connection (a startup option) and
 * tsdb_admin.read_only_role (set with ALTER ROLE by the role's admin) latch
 * the session read-only at its first statement; from then on every
 * transaction is forced read-only before each statement runs, so nothing
 * the session does (SET, RESET, BEGIN READ WRITE, set_config, SET ROLE, a
 * function's SET clause) can make a write succeed.
 */
#include "postgres.h"

#include "access/xact.h"
#include "miscadmin.h"
#include "nodes/parsenodes.h"
#include "utils/builtins.h"
#include "utils/guc.h"

#include "dbcloud_guard.h"

/* Once true, the session stays read-only until it ends. */
static bool session_ro = false;

/*
 * session_read_only latches the session read-only once either setting is
 * on. It does no catalog access: it also runs in transaction callbacks.
 */
bool
session_read_only(void)
{
	if (!session_ro && (guard_ro_connection || guard_ro_role))
		session_ro = true;
	return session_ro;
}

static void
refuse_read_write(const char *what)
{
	ereport(ERROR,
			(errcode(ERRCODE_READ_ONLY_SQL_TRANSACTION),
			 errmsg("%s is not allowed: this session is read-only", what),
			 errdetail("The session was opened with tsdb_admin.read_only_connection or by a role with tsdb_admin.read_only_role; it stays read-only until it ends.")));
}

/* true when a DefElem list asks for transaction_read_only = false */
static bool
asks_read_write(List *options)
{
	ListCell   *lc;

	foreach(lc, options)
	{
		DefElem    *d = (DefElem *) lfirst(lc);

		if (strcmp(d->defname, "transaction_read_only") == 0 && d->arg != NULL &&
			IsA(d->arg, A_Const) && nodeTag(&((A_Const *) d->arg)->val) == T_Integer &&
			intVal(&((A_Const *) d->arg)->val) == 0)
			return true;
	}
	return false;
}

/* guard_read_only refuses what would leave a read-only session. */
void
guard_read_only(Node *stmt)
{
	if (IsA(stmt, TransactionStmt))
	{
		TransactionStmt *s = (TransactionStmt *) stmt;

		if ((s->kind == TRANS_STMT_BEGIN || s->kind == TRANS_STMT_START) && asks_read_write(s->options))
			refuse_read_write("BEGIN READ WRITE");
	}
	else if (IsA(stmt, VariableSetStmt))
	{
		VariableSetStmt *s = (VariableSetStmt *) stmt;

		if (s->kind == VAR_SET_MULTI)
		{
			if (asks_read_write(s->args))
				refuse_read_write(s->name && strcmp(s->name, "SESSION CHARACTERISTICS") == 0 ?
								  "SET SESSION CHARACTERISTICS AS TRANSACTION READ WRITE" :
								  "SET TRANSACTION READ WRITE");
		}
		else if (s->kind == VAR_RESET_ALL)
		{
			/* harmless: the session is forced read-only below anyway */
		}
		else if (s->name != NULL &&
				 (is_ro_setting(s->name) ||
				  pg_strcasecmp(s->name, "default_transaction_read_only") == 0 ||
				  pg_strcasecmp(s->name, "transaction_read_only") == 0))
		{
			bool		on = false;
			char	   *v = s->kind == VAR_SET_VALUE ? ExtractSetVariableArgs(s) : NULL;

			if (v == NULL || !parse_bool(v, &on) || !on)
				refuse_read_write(psprintf("changing %s", s->name));
		}
	}
}

void
force_read_only(void)
{
	DefaultXactReadOnly = true;
	if (IsTransactionState())
		XactReadOnly = true;
}

/*
 * guard_read_only_xact is the backstop of read-only sessions. A
 * transaction that wrote anything has a transaction ID; one of a read-only
 * session must not commit. This catches what forcing XactReadOnly cannot:
 * functions that write without checking it (PostgreSQL 15's large-object
 * functions, also called through the protocol's fast-path, which bypasses
 * the executor; C functions of extensions), and temporary tables. At the
 * end of every transaction the next one is made to start read-only as well.
 */
void
guard_read_only_xact(XactEvent event, void *arg)
{
	if (!session_read_only())
		return;
	switch (event)
	{
		case XACT_EVENT_PRE_COMMIT:
		case XACT_EVENT_PRE_PREPARE:
			if (TransactionIdIsValid(GetTopTransactionIdIfAny()))
				ereport(ERROR,
						(errcode(ERRCODE_READ_ONLY_SQL_TRANSACTION),
						 errmsg("cannot commit a transaction that wrote: this session is read-only"),
						 errdetail("The session was opened with tsdb_admin.read_only_connection or by a role with tsdb_admin.read_only_role; it stays read-only until it ends.")));
			break;
		case XACT_EVENT_COMMIT:
		case XACT_EVENT_ABORT:
		case XACT_EVENT_PREPARE:
			DefaultXactReadOnly = true;
			break;
		default:
			break;
	}
}

/*
 * check_read_only_role keeps tsdb_admin.read_only_role what ALTER ROLE
 * made it: a client may not send it at startup (a startup option outranks
 * the role's setting), and nothing inside a session (SET, RESET,
 * set_config, a function's SET clause) may change it. ALTER ROLE's own
 * validation (PGC_S_TEST) passes. Attached to a database or to every role
 * (by a superuser, or on an instance from before the guard refused it), it
 * never makes dbcloud's own superuser sessions read-only: those settings
 * are applied at login inside a transaction, where the session's user is
 * known.
 */
bool
check_read_only_role(bool *newval, void **extra, GucSource source)
{
	if (source == PGC_S_CLIENT)
	{
		GUC_check_errcode(ERRCODE_INSUFFICIENT_PRIVILEGE);
		GUC_check_errmsg("%s cannot be set by a client", RO_ROLE);
		GUC_check_errdetail("It is set with ALTER ROLE by the role's administrator.");
		return false;
	}
	if (source >= PGC_S_INTERACTIVE && source != PGC_S_TEST && *newval != guard_ro_role)
	{
		GUC_check_errcode(session_ro ? ERRCODE_READ_ONLY_SQL_TRANSACTION : ERRCODE_INSUFFICIENT_PRIVILEGE);
		GUC_check_errmsg("%s cannot be changed inside a session", RO_ROLE);
		GUC_check_errdetail("It is set with ALTER ROLE by the role's administrator.");
		return false;
	}
	if (*newval && source >= PGC_S_GLOBAL && source <= PGC_S_DATABASE_USER &&
		IsTransactionState() && superuser_arg(GetSessionUserId()))
		*newval = false;
	return true;
}
