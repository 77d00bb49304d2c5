/*
 * storage.c: storage read-only. dbcloud_guard.storage_read_only, set by
 * dbcloud in postgresql.conf when a service has used 95% of its storage
 * limit and cleared below it (a reload, no restart), refuses to
 * non-superusers every way a statement makes the data directory grow
 * (tables, catalogs, WAL, large objects, the notification queue) with
 * SQLSTATE 25006, and lets through what frees space (DELETE, TRUNCATE,
 * DROP, VACUUM) so the tenant can get out. Being a SIGHUP setting, no
 * session can change it.
 *
 * Three checks, each at a point every path goes through:
 * - utility statements: an allow-list (guard_storage_utility): what is not
 *   known to add nothing is refused, so a new statement kind is refused
 *   until judged;
 * - the executor (guard_storage_executor): INSERT, UPDATE, MERGE, a
 *   data-modifying WITH, row locks, and results written into a new table,
 *   whoever runs them (a function, a DO block, a procedure, a trigger);
 * - functions that write without a statement the checks above see
 *   (guard_storage_function), through the object access hook that
 *   PostgreSQL calls before any function call is set up: in an expression,
 *   a FROM clause, an aggregate, CALL, a PL/pgSQL expression, and the
 *   protocol's fast-path call. Built-in functions are included (the fmgr
 *   hooks never see them).
 */
#include "postgres.h"

#include "access/transam.h"
#include "catalog/dependency.h"
#include "catalog/pg_proc.h"
#include "commands/extension.h"
#include "miscadmin.h"
#include "nodes/parsenodes.h"
#include "nodes/plannodes.h"
#include "tcop/dest.h"
#include "tcop/utility.h"
#include "utils/fmgroids.h"
#include "utils/lsyscache.h"
#include "utils/plancache.h"

#include "dbcloud_guard.h"

/*
 * storage_limited: the service is near its storage limit and the session
 * is not dbcloud's own: its user or the current role is not a superuser.
 * The session user counts too, so that a function a superuser owns and
 * runs as its definer (an extension's) cannot write for a tenant. Runs
 * inside a transaction, where the catalog may be read.
 */
bool
storage_limited(void)
{
	return guard_storage_ro && IsTransactionState() &&
		(!superuser() || !superuser_arg(GetSessionUserId()));
}

static void
refuse_growth(const char *what)
{
	ereport(ERROR,
			(errcode(ERRCODE_READ_ONLY_SQL_TRANSACTION),
			 errmsg("%s is not allowed: this service has used 95%% of its storage limit", what),
			 errdetail("Writes that add data are refused until usage is below the limit again; DELETE, TRUNCATE, DROP and VACUUM still run."),
			 errhint("Delete data (then VACUUM), or resize the service for a larger limit; writes resume by themselves.")));
}

/*
 * utility_adds_nothing: the utility statements a storage-limited session
 * keeps. They read, set session state, free space, or run statements that
 * are checked on their own (EXECUTE, DO, CALL, cursors: the executor and
 * the function check see what they run). ANALYZE rewrites a bounded number
 * of pg_statistic rows. Everything else (DDL, COMMENT, GRANT, ALTER ROLE
 * ... SET, NOTIFY, PREPARE TRANSACTION ...) adds catalog rows, WAL or
 * files that a loop could make without bound.
 */
static bool
utility_adds_nothing(Node *stmt)
{
	switch (nodeTag(stmt))
	{
		case T_TransactionStmt:
			/* A prepared transaction keeps its WAL until resolved. */
			return ((TransactionStmt *) stmt)->kind != TRANS_STMT_PREPARE;
		case T_CopyStmt:
			return !((CopyStmt *) stmt)->is_from;
		case T_ExplainStmt:
			{
				/* EXPLAIN ANALYZE CREATE TABLE AS creates the table. */
				Node	   *q = ((ExplainStmt *) stmt)->query;

				return !(IsA(q, Query) && ((Query *) q)->commandType == CMD_UTILITY &&
						 !utility_adds_nothing(((Query *) q)->utilityStmt));
			}
		case T_VariableSetStmt:
		case T_VariableShowStmt:
		case T_DiscardStmt:
		case T_ConstraintsSetStmt:
		case T_DeclareCursorStmt:
		case T_FetchStmt:
		case T_ClosePortalStmt:
		case T_PrepareStmt:
		case T_ExecuteStmt:
		case T_DeallocateStmt:
		case T_ListenStmt:
		case T_UnlistenStmt:
		case T_LockStmt:
		case T_CheckPointStmt:
		case T_DoStmt:
		case T_CallStmt:
		case T_VacuumStmt:
		case T_TruncateStmt:
		case T_DropStmt:
		case T_DropRoleStmt:
		case T_DropdbStmt:
		case T_DropOwnedStmt:
		case T_ReassignOwnedStmt:
		case T_DropUserMappingStmt:
		case T_DropSubscriptionStmt:
		case T_DropTableSpaceStmt:
			return true;
		default:
			return false;
	}
}

/* guard_storage_utility refuses the utility statements that add data. */
void
guard_storage_utility(Node *stmt)
{
	if (!utility_adds_nothing(stmt))
		refuse_growth(CreateCommandName(stmt));
}

/* locks_rows: SELECT ... FOR UPDATE/SHARE writes every row it locks. */
static bool
locks_rows(PlannedStmt *p)
{
	ListCell   *lc;

	foreach(lc, p->rowMarks)
	{
		PlanRowMark *rm = (PlanRowMark *) lfirst(lc);

		if (RowMarkRequiresRowShareLock(rm->markType))
			return true;
	}
	return false;
}

/* guard_storage_executor refuses the queries that add data. */
void
guard_storage_executor(QueryDesc *queryDesc)
{
	switch (queryDesc->operation)
	{
		case CMD_INSERT:
			refuse_growth("INSERT");
			break;
		case CMD_UPDATE:
			refuse_growth("UPDATE");
			break;
		case CMD_MERGE:
			refuse_growth("MERGE");
			break;
		default:
			/* A data-modifying WITH may hold an INSERT. */
			if (queryDesc->plannedstmt->hasModifyingCTE && queryDesc->operation != CMD_DELETE)
				refuse_growth("a data-modifying WITH");
			if (locks_rows(queryDesc->plannedstmt))
				refuse_growth("SELECT FOR UPDATE/SHARE");
			break;
	}
	/* CREATE TABLE AS, SELECT INTO, REFRESH MATERIALIZED VIEW, however reached. */
	if (queryDesc->dest != NULL &&
		(queryDesc->dest->mydest == DestIntoRel || queryDesc->dest->mydest == DestTransientRel))
		refuse_growth("writing query results into a table");
}

/*
 * TimescaleDB's functions that add rows or data from C, past the executor:
 * jobs and policies (a row each, without bound in a loop), hypertables and
 * dimensions, decompressing (the data grows by the compression ratio),
 * rewriting chunks (like CLUSTER) and refreshing continuous aggregates.
 * drop_chunks and compress_chunk, which free space, stay.
 */
static const char *const timescaledb_growth[] = {
	"add_job", "alter_job", "create_hypertable", "add_dimension",
	"attach_tablespace", "decompress_chunk", "convert_to_rowstore",
	"reorder_chunk", "move_chunk", "merge_chunks",
	"refresh_continuous_aggregate", "add_retention_policy",
	"add_reorder_policy", "add_compression_policy",
	"add_columnstore_policy", "add_continuous_aggregate_policy",
	"add_policies",
};

static bool
timescaledb_grows(Oid fn)
{
	Oid			ext;
	char	   *extname;
	char	   *name;
	int			i;

	if (fn < FirstNormalObjectId)
		return false;
	ext = getExtensionOfObject(ProcedureRelationId, fn);
	extname = OidIsValid(ext) ? get_extension_name(ext) : NULL;
	if (extname == NULL || strcmp(extname, "timescaledb") != 0)
		return false;
	name = get_func_name(fn);
	for (i = 0; name != NULL && i < lengthof(timescaledb_growth); i++)
		if (strcmp(name, timescaledb_growth[i]) == 0)
			return true;
	return false;
}

/*
 * PostgreSQL 17 gave pg_logical_emit_message a fourth argument (flush),
 * which renamed the macros of its OIDs.
 */
#if PG_VERSION_NUM >= 170000
#define F_EMIT_MESSAGE_TEXT F_PG_LOGICAL_EMIT_MESSAGE_BOOL_TEXT_TEXT_BOOL
#define F_EMIT_MESSAGE_BYTEA F_PG_LOGICAL_EMIT_MESSAGE_BOOL_TEXT_BYTEA_BOOL
#else
#define F_EMIT_MESSAGE_TEXT F_PG_LOGICAL_EMIT_MESSAGE_BOOL_TEXT_TEXT
#define F_EMIT_MESSAGE_BYTEA F_PG_LOGICAL_EMIT_MESSAGE_BOOL_TEXT_BYTEA
#endif

/*
 * guard_storage_function refuses the functions that write without a
 * statement the other checks see. WAL without bound: logical decoding
 * messages (transactional or not: the non-transactional one has no
 * transaction ID, so nothing at commit could see it), sequences (nextval,
 * setval), WAL switches and restore points (superuser-only by default,
 * refused should one be granted); large objects (pg_largeobject); the
 * notification queue (pg_notify, up to 8 GB when a listener lags).
 * Reading and freeing (lo_get, loread, lo_unlink) stay.
 */
void
guard_storage_function(Oid fn)
{
	switch (fn)
	{
		case F_EMIT_MESSAGE_TEXT:
		case F_EMIT_MESSAGE_BYTEA:
			refuse_growth("pg_logical_emit_message");
			break;
		case F_LO_CREAT:
		case F_LO_CREATE:
		case F_LO_FROM_BYTEA:
		case F_LO_PUT:
		case F_LOWRITE:
		case F_LO_IMPORT_TEXT:
		case F_LO_IMPORT_TEXT_OID:
		case F_LO_TRUNCATE:
		case F_LO_TRUNCATE64:
			refuse_growth("writing a large object");
			break;
		case F_NEXTVAL:
		case F_SETVAL_REGCLASS_INT8:
		case F_SETVAL_REGCLASS_INT8_BOOL:
			refuse_growth("advancing a sequence");
			break;
		case F_PG_NOTIFY:
			refuse_growth("pg_notify");
			break;
		case F_PG_SWITCH_WAL:
		case F_PG_CREATE_RESTORE_POINT:
			refuse_growth("writing WAL");
			break;
		default:
			if (timescaledb_grows(fn))
				refuse_growth(get_func_name(fn));
			break;
	}
}

/*
 * assign_storage_read_only: when the limit is reached, every cached plan is
 * invalidated, so that a statement prepared before (a prepared statement,
 * a PL/pgSQL expression whose evaluation state lives across the statements
 * of an open transaction) is planned and set up again, through the checks
 * above, before it next runs.
 */
void
assign_storage_read_only(bool newval, void *extra)
{
	if (newval && !guard_storage_ro)
		ResetPlanCache();
}
