/*
 * dbcloud_guard: keeps a service's non-superuser roles (tsdbadmin and the
 * roles it creates) inside their own database, and enforces the read-only
 * sessions of the original's tsdb_admin extension.
 *
 * Loaded on every instance through shared_preload_libraries. PostgreSQL 15
 * lets a CREATEROLE role grant itself any non-superuser role, including the
 * predefined roles that run programs and read or write files as the server's
 * OS user; from there a tenant reaches the host and every other service on
 * it. The guard refuses, for any role that is not a superuser, every
 * statement that leads there (see docs/security.md for the list and why),
 * with SQLSTATE 42501 and a message naming what is reserved.
 *
 * Read-only sessions: tsdb_admin.read_only_connection (a startup option)
 * and tsdb_admin.read_only_role (set with ALTER ROLE by the role's admin)
 * latch the session read-only at its first statement; from then on every
 * transaction is forced read-only before each statement runs, so nothing the
 * session does (SET, RESET, BEGIN READ WRITE, set_config, SET ROLE, a
 * function's SET clause) can make a write succeed.
 *
 * Storage read-only: dbcloud_guard.storage_read_only, set by dbcloud in
 * postgresql.conf when a service has used 95% of its storage limit and
 * cleared below it (a reload, no restart), refuses to non-superusers what
 * makes the data grow (INSERT, UPDATE, MERGE, COPY FROM, CREATE TABLE and
 * INDEX, table rewrites) with SQLSTATE 25006, and lets through what frees
 * space (DELETE, TRUNCATE, DROP, VACUUM) so the tenant can get out. Being
 * a SIGHUP setting, no session can change it. The filesystem's quota at
 * 100% stays the hard limit for what this does not see (large objects).
 */
#include "postgres.h"

#include "access/xact.h"
#include "catalog/pg_authid.h"
#include "catalog/pg_language.h"
#include "commands/proclang.h"
#include "executor/executor.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "nodes/parsenodes.h"
#include "tcop/utility.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/syscache.h"

PG_MODULE_MAGIC;

void		_PG_init(void);

static ProcessUtility_hook_type prev_utility = NULL;
static ExecutorStart_hook_type prev_executor_start = NULL;

/* The tsdb_admin GUCs, as the original's extension names them. */
static bool ro_connection = false;
static bool ro_role = false;

/* Once true, the session stays read-only until it ends. */
static bool session_ro = false;

/* dbcloud_guard.storage_read_only: the service is near its storage limit. */
static bool storage_ro = false;

#define RO_CONNECTION "tsdb_admin.read_only_connection"
#define RO_ROLE "tsdb_admin.read_only_role"
#define STORAGE_RO "dbcloud_guard.storage_read_only"

/* The predefined roles that reach the server's OS. */
static const char *const os_roles[] = {
	"pg_execute_server_program", "pg_read_server_files", "pg_write_server_files",
};

/*
 * reserved_role: the roles dbcloud owns: the superuser, its own roles
 * (the pooler's lookup role and any later dbcloud_*), and PostgreSQL's
 * predefined pg_* roles, which only the superuser may change.
 */
static bool
reserved_role(const char *name)
{
	return name != NULL &&
		(strcmp(name, "postgres") == 0 ||
		 strncmp(name, "dbcloud_", 8) == 0 ||
		 strncmp(name, "pg_", 3) == 0);
}

/* dbcloud's own roles and the superuser: never granted to anyone. */
static bool
platform_role(const char *name)
{
	return name != NULL &&
		(strcmp(name, "postgres") == 0 || strncmp(name, "dbcloud_", 8) == 0);
}

static void
refuse(const char *what, const char *why)
{
	ereport(ERROR,
			(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
			 errmsg("%s is not allowed on this service", what),
			 errdetail("%s", why),
			 errhint("These are reserved to the platform (dbcloud_guard).")));
}

static char *
rolespec_name(RoleSpec *spec)
{
	Oid			oid;

	if (spec == NULL)
		return NULL;
	if (spec->roletype == ROLESPEC_CSTRING)
		return spec->rolename;
	if (spec->roletype == ROLESPEC_PUBLIC)
		return NULL;
	oid = get_rolespec_oid(spec, true);
	return OidIsValid(oid) ? GetUserNameFromId(oid, true) : NULL;
}

/*
 * reaches_os reports whether membership in the named role gives a way to
 * the server's OS: it is one of the OS roles, or is (transitively) a member
 * of one, or is a platform role.
 */
static bool
reaches_os(const char *name)
{
	Oid			oid;
	int			i;

	if (name == NULL)
		return false;
	if (platform_role(name))
		return true;
	for (i = 0; i < lengthof(os_roles); i++)
		if (strcmp(name, os_roles[i]) == 0)
			return true;
	oid = get_role_oid(name, true);
	if (!OidIsValid(oid))
		return false;
	if (superuser_arg(oid))
		return true;
	for (i = 0; i < lengthof(os_roles); i++)
	{
		Oid			os = get_role_oid(os_roles[i], true);

		if (OidIsValid(os) && is_member_of_role_nosuper(oid, os))
			return true;
	}
	return false;
}

static void
check_granted(const char *name)
{
	if (reaches_os(name))
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("membership in role \"%s\" is reserved to the platform", name),
				 errdetail("The roles pg_execute_server_program, pg_read_server_files and pg_write_server_files, roles that are members of them, the superuser and dbcloud's own roles cannot be granted: they reach the server's operating system or belong to dbcloud."),
				 errhint("These are reserved to the platform (dbcloud_guard).")));
}

static void
check_reserved(const char *name, const char *verb)
{
	if (reserved_role(name))
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("role \"%s\" is reserved to the platform and cannot be %s", name, verb),
				 errdetail("The roles postgres, dbcloud_* and pg_* belong to dbcloud and PostgreSQL."),
				 errhint("These are reserved to the platform (dbcloud_guard).")));
}

static void
check_role_list(List *roles, const char *verb)
{
	ListCell   *lc;

	foreach(lc, roles)
		check_reserved(rolespec_name((RoleSpec *) lfirst(lc)), verb);
}

static void
check_granted_list(List *roles)
{
	ListCell   *lc;

	foreach(lc, roles)
		check_granted(rolespec_name((RoleSpec *) lfirst(lc)));
}

/* check_role_options checks CREATE ROLE's and ALTER GROUP's membership clauses. */
static void
check_role_options(List *options)
{
	ListCell   *lc;

	foreach(lc, options)
	{
		DefElem    *d = (DefElem *) lfirst(lc);

		if (strcmp(d->defname, "addroleto") == 0)	/* IN ROLE */
			check_granted_list((List *) d->arg);
		else if (strcmp(d->defname, "rolemembers") == 0 ||	/* ROLE, USER */
				 strcmp(d->defname, "adminmembers") == 0)	/* ADMIN */
			check_role_list((List *) d->arg, "made a member of another role");
	}
}

static void
check_language(const char *lang)
{
	Oid			oid;
	HeapTuple	tup;
	bool		trusted;

	if (lang == NULL)
		return;
	oid = get_language_oid(lang, true);
	if (!OidIsValid(oid))
		return;					/* PostgreSQL reports it */
	tup = SearchSysCache1(LANGOID, ObjectIdGetDatum(oid));
	if (!HeapTupleIsValid(tup))
		return;
	trusted = ((Form_pg_language) GETSTRUCT(tup))->lanpltrusted;
	ReleaseSysCache(tup);
	if (!trusted)
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("language \"%s\" is reserved to the platform", lang),
				 errdetail("Untrusted languages, C and internal functions run with the server's operating system rights."),
				 errhint("These are reserved to the platform (dbcloud_guard).")));
}

static char *
language_option(List *options)
{
	ListCell   *lc;

	foreach(lc, options)
	{
		DefElem    *d = (DefElem *) lfirst(lc);

		if (strcmp(d->defname, "language") == 0)
			return strVal(d->arg);
	}
	return NULL;
}

static bool
is_ro_setting(const char *name)
{
	return name != NULL &&
		(pg_strcasecmp(name, RO_CONNECTION) == 0 ||
		 pg_strcasecmp(name, RO_ROLE) == 0);
}

/* guard_utility is the tenant guard, for non-superusers. */
static void
guard_utility(Node *stmt)
{
	switch (nodeTag(stmt))
	{
		case T_CopyStmt:
			{
				CopyStmt   *s = (CopyStmt *) stmt;

				if (s->is_program)
					refuse("COPY to or from a program", "Programs would run as the server's operating system user.");
				if (s->filename != NULL)
					refuse("COPY to or from a server file", "Files on the server belong to the platform; use COPY FROM STDIN or TO STDOUT (psql's \\copy).");
				break;
			}
		case T_AlterSystemStmt:
			refuse("ALTER SYSTEM", "The server's configuration belongs to the platform.");
			break;
		case T_LoadStmt:
			refuse("LOAD", "Loading libraries into the server is reserved to the platform.");
			break;
		case T_CreatePLangStmt:
			refuse("CREATE LANGUAGE", "Procedural languages are installed by the platform.");
			break;
		case T_CreateFunctionStmt:
			{
				CreateFunctionStmt *s = (CreateFunctionStmt *) stmt;

				check_language(language_option(s->options));
				break;
			}
		case T_DoStmt:
			check_language(language_option(((DoStmt *) stmt)->args));
			break;
		case T_GrantRoleStmt:
			{
				GrantRoleStmt *s = (GrantRoleStmt *) stmt;
				ListCell   *lc;

				check_role_list(s->grantee_roles, s->is_grant ? "granted roles" : "changed");
				if (s->is_grant)
					foreach(lc, s->granted_roles)
						check_granted(((AccessPriv *) lfirst(lc))->priv_name);
				break;
			}
		case T_CreateRoleStmt:
			{
				CreateRoleStmt *s = (CreateRoleStmt *) stmt;

				check_reserved(s->role, "created");
				check_role_options(s->options);
				break;
			}
		case T_AlterRoleStmt:
			{
				AlterRoleStmt *s = (AlterRoleStmt *) stmt;

				check_reserved(rolespec_name(s->role), "altered");
				if (s->action > 0)
					check_role_options(s->options);
				/* ALTER GROUP g ADD USER u grants g: */
				if (s->action > 0)
				{
					ListCell   *lc;

					foreach(lc, s->options)
						if (strcmp(((DefElem *) lfirst(lc))->defname, "rolemembers") == 0)
							check_granted(rolespec_name(s->role));
				}
				break;
			}
		case T_AlterRoleSetStmt:
			{
				AlterRoleSetStmt *s = (AlterRoleSetStmt *) stmt;
				char	   *name = rolespec_name(s->role);
				Oid			oid = s->role ? get_rolespec_oid(s->role, true) : InvalidOid;

				if (s->role != NULL)
					check_reserved(name, "altered");
				if ((s->setstmt->name == NULL || is_ro_setting(s->setstmt->name)) &&
					OidIsValid(oid) && (oid == GetUserId() || oid == GetSessionUserId() || oid == GetOuterUserId()))
					ereport(ERROR,
							(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
							 errmsg("a role cannot change its own read-only setting"),
							 errdetail("tsdb_admin.read_only_role is set and reset by the role's administrator (such as tsdbadmin), never by the role itself."),
							 errhint("These are reserved to the platform (dbcloud_guard).")));
				break;
			}
		case T_AlterDatabaseSetStmt:
			{
				VariableSetStmt *v = ((AlterDatabaseSetStmt *) stmt)->setstmt;

				if (v->name != NULL && is_ro_setting(v->name))
					refuse("setting tsdb_admin read-only settings on a database",
						   "Read-only is set per role (ALTER ROLE r SET tsdb_admin.read_only_role = true) or per connection.");
				break;
			}
		case T_DropRoleStmt:
			check_role_list(((DropRoleStmt *) stmt)->roles, "dropped");
			break;
		case T_RenameStmt:
			{
				RenameStmt *s = (RenameStmt *) stmt;

				if (s->renameType == OBJECT_ROLE)
				{
					check_reserved(s->subname, "renamed");
					check_reserved(s->newname, "used as a new name");
				}
				break;
			}
		case T_VariableSetStmt:
			{
				VariableSetStmt *s = (VariableSetStmt *) stmt;

				if (s->kind == VAR_SET_VALUE && s->name != NULL &&
					(strcmp(s->name, "role") == 0 || strcmp(s->name, "session_authorization") == 0))
				{
					char	   *v = ExtractSetVariableArgs(s);

					if (v != NULL && pg_strcasecmp(v, "none") != 0)
						check_reserved(v, "assumed with SET ROLE or SET SESSION AUTHORIZATION");
				}
				break;
			}
		default:
			break;
	}
}

/*
 * session_read_only latches the session read-only once either setting is
 * on. It does no catalog access: it also runs in transaction callbacks.
 */
static bool
session_read_only(void)
{
	if (!session_ro && (ro_connection || ro_role))
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
static void
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

static void
force_read_only(void)
{
	DefaultXactReadOnly = true;
	if (IsTransactionState())
		XactReadOnly = true;
}

/*
 * storage_limited: the service is near its storage limit and the current
 * role is not a superuser (dbcloud's own work goes on). Runs inside a
 * transaction, where superuser() may read the catalog.
 */
static bool
storage_limited(void)
{
	return storage_ro && !superuser();
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

/* guard_storage_utility refuses the utility statements that add data. */
static void
guard_storage_utility(Node *stmt)
{
	switch (nodeTag(stmt))
	{
		case T_CopyStmt:
			if (((CopyStmt *) stmt)->is_from)
				refuse_growth("COPY FROM");
			break;
		case T_CreateStmt:
			refuse_growth("CREATE TABLE");
			break;
		case T_CreateTableAsStmt:
			refuse_growth("CREATE TABLE AS");
			break;
		case T_IndexStmt:
			refuse_growth("CREATE INDEX");
			break;
		case T_RefreshMatViewStmt:
			refuse_growth("REFRESH MATERIALIZED VIEW");
			break;
		case T_ClusterStmt:
			refuse_growth("CLUSTER");
			break;
		case T_ReindexStmt:
			refuse_growth("REINDEX");
			break;
		case T_AlterTableStmt:
			refuse_growth("ALTER TABLE");
			break;
		case T_CreatedbStmt:
			refuse_growth("CREATE DATABASE");
			break;
		case T_CreateExtensionStmt:
			refuse_growth("CREATE EXTENSION");
			break;
		default:
			break;
	}
}

/*
 * dbcloud_guard_xact is the backstop of read-only sessions. A transaction
 * that wrote anything has a transaction ID; one of a read-only session
 * must not commit. This catches what forcing XactReadOnly cannot: functions
 * that write without checking it (PostgreSQL 15's large-object functions,
 * also called through the protocol's fast-path, which bypasses the
 * executor; C functions of extensions), and temporary tables. At the end of
 * every transaction the next one is made to start read-only as well.
 */
static void
dbcloud_guard_xact(XactEvent event, void *arg)
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

static void
dbcloud_guard_utility(PlannedStmt *pstmt, const char *queryString, bool readOnlyTree,
					  ProcessUtilityContext context, ParamListInfo params,
					  QueryEnvironment *queryEnv, DestReceiver *dest, QueryCompletion *qc)
{
	Node	   *stmt = pstmt->utilityStmt;

	if (!superuser())
		guard_utility(stmt);
	if (storage_limited())
		guard_storage_utility(stmt);
	if (session_read_only())
	{
		guard_read_only(stmt);
		force_read_only();
	}
	if (prev_utility)
		prev_utility(pstmt, queryString, readOnlyTree, context, params, queryEnv, dest, qc);
	else
		standard_ProcessUtility(pstmt, queryString, readOnlyTree, context, params, queryEnv, dest, qc);
}

static void
dbcloud_guard_executor_start(QueryDesc *queryDesc, int eflags)
{
	if (session_read_only())
		force_read_only();
	if (storage_limited())
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
				break;
		}
	}
	if (prev_executor_start)
		prev_executor_start(queryDesc, eflags);
	else
		standard_ExecutorStart(queryDesc, eflags);
}

/*
 * check_read_only_role keeps tsdb_admin.read_only_role what ALTER ROLE
 * made it: a client may not send it at startup (a startup option outranks
 * the role's setting), and nothing inside a session (SET, RESET,
 * set_config, a function's SET clause) may change it. ALTER ROLE's own
 * validation (PGC_S_TEST) passes.
 */
static bool
check_read_only_role(bool *newval, void **extra, GucSource source)
{
	if (source == PGC_S_CLIENT)
	{
		GUC_check_errcode(ERRCODE_INSUFFICIENT_PRIVILEGE);
		GUC_check_errmsg("%s cannot be set by a client", RO_ROLE);
		GUC_check_errdetail("It is set with ALTER ROLE by the role's administrator.");
		return false;
	}
	if (source >= PGC_S_INTERACTIVE && source != PGC_S_TEST && *newval != ro_role)
	{
		GUC_check_errcode(session_ro ? ERRCODE_READ_ONLY_SQL_TRANSACTION : ERRCODE_INSUFFICIENT_PRIVILEGE);
		GUC_check_errmsg("%s cannot be changed inside a session", RO_ROLE);
		GUC_check_errdetail("It is set with ALTER ROLE by the role's administrator.");
		return false;
	}
	return true;
}

void
_PG_init(void)
{
	if (!process_shared_preload_libraries_in_progress)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("dbcloud_guard must be loaded through shared_preload_libraries")));

	DefineCustomBoolVariable(RO_CONNECTION,
							 "Makes the whole session read-only; only settable when the session starts.",
							 NULL, &ro_connection, false,
							 PGC_BACKEND, 0, NULL, NULL, NULL);
	DefineCustomBoolVariable(RO_ROLE,
							 "Makes every session of the role read-only; set with ALTER ROLE by the role's administrator.",
							 NULL, &ro_role, false,
							 PGC_USERSET, 0, check_read_only_role, NULL, NULL);
	DefineCustomBoolVariable(STORAGE_RO,
							 "Refuses writes that add data to non-superusers: the service is near its storage limit.",
							 "Set by dbcloud in postgresql.conf; reloaded, never set in a session.",
							 &storage_ro, false,
							 PGC_SIGHUP, 0, NULL, NULL, NULL);
	MarkGUCPrefixReserved("tsdb_admin");
	MarkGUCPrefixReserved("dbcloud_guard");

	prev_utility = ProcessUtility_hook;
	ProcessUtility_hook = dbcloud_guard_utility;
	RegisterXactCallback(dbcloud_guard_xact, NULL);
	prev_executor_start = ExecutorStart_hook;
	ExecutorStart_hook = dbcloud_guard_executor_start;
}
