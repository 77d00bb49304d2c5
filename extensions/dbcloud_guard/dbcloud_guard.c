/*
 * dbcloud_guard: keeps a service's non-superuser roles (tsdbadmin and the
 * roles it creates) inside their own database, enforces the read-only
 * sessions of the original's tsdb_admin extension, and stops a service's
 * growth near its storage limit.
 *
 * Loaded on every instance through shared_preload_libraries. PostgreSQL 15
 * lets a CREATEROLE role grant itself any non-superuser role, including the
 * predefined roles that run programs, read or write files as the server's
 * OS user, or read and write every table; from there a tenant reaches the
 * host and every other service on it. The guard refuses, for any role that
 * is not a superuser, every statement that leads there (see
 * docs/security.md for the list and why), with SQLSTATE 42501 and a
 * message naming what is reserved.
 *
 * This file holds the hooks and the settings; roles.c the reserved roles
 * and the settings a tenant may not attach to a database or role,
 * readonly.c the read-only sessions, storage.c storage read-only,
 * ended.c the reason given to sessions dbcloud ends and the seal that
 * refuses logins during a BLUE_GREEN switch.
 */
#include "postgres.h"

#include "access/xact.h"
#include "catalog/objectaccess.h"
#include "catalog/pg_language.h"
#include "catalog/pg_proc.h"
#include "commands/proclang.h"
#include "executor/executor.h"
#include "fmgr.h"
/*
 * libpq-be.h includes GSSAPI's headers, which a build host need not have
 * (libkrb5-dev): without ENABLE_GSS it does not, and Port keeps the same
 * layout (PostgreSQL keeps a pointer where the GSSAPI state goes); the
 * fields read here (user_name, database_name) come before any of it.
 */
#undef ENABLE_GSS
#include "libpq/auth.h"
#include "libpq/libpq-be.h"
#include "miscadmin.h"
#include "nodes/parsenodes.h"
#include "tcop/utility.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/syscache.h"

#include "dbcloud_guard.h"

PG_MODULE_MAGIC;

void		_PG_init(void);

static ProcessUtility_hook_type prev_utility = NULL;
static ExecutorStart_hook_type prev_executor_start = NULL;
static object_access_hook_type prev_object_access = NULL;
static ClientAuthentication_hook_type prev_client_auth = NULL;
static emit_log_hook_type prev_emit_log = NULL;

/* The tsdb_admin settings, as the original's extension names them. */
bool		guard_ro_connection = false;
bool		guard_ro_role = false;

/* dbcloud_guard.storage_read_only: the service is near its storage limit. */
bool		guard_storage_ro = false;

void
guard_refuse(const char *what, const char *why)
{
	ereport(ERROR,
			(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
			 errmsg("%s is not allowed on this service", what),
			 errdetail("%s", why),
			 errhint("These are reserved to the platform (dbcloud_guard).")));
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
					guard_refuse("COPY to or from a program", "Programs would run as the server's operating system user.");
				if (s->filename != NULL)
					guard_refuse("COPY to or from a server file", "Files on the server belong to the platform; use COPY FROM STDIN or TO STDOUT (psql's \\copy).");
				break;
			}
		case T_AlterSystemStmt:
			guard_refuse("ALTER SYSTEM", "The server's configuration belongs to the platform.");
			break;
		case T_LoadStmt:
			guard_refuse("LOAD", "Loading libraries into the server is reserved to the platform.");
			break;
		case T_CreatePLangStmt:
			guard_refuse("CREATE LANGUAGE", "Procedural languages are installed by the platform.");
			break;
		case T_CreateFunctionStmt:
			check_language(language_option(((CreateFunctionStmt *) stmt)->options));
			break;
		case T_DoStmt:
			check_language(language_option(((DoStmt *) stmt)->args));
			break;
		default:
			guard_role_utility(stmt);
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
		guard_storage_executor(queryDesc);
	if (prev_executor_start)
		prev_executor_start(queryDesc, eflags);
	else
		standard_ExecutorStart(queryDesc, eflags);
}

/*
 * dbcloud_guard_object_access: PostgreSQL calls it (OAT_FUNCTION_EXECUTE)
 * before any function call is set up, built-in or not, wherever it is:
 * storage read-only refuses the functions that write by themselves.
 */
static void
dbcloud_guard_object_access(ObjectAccessType access, Oid classId, Oid objectId, int subId, void *arg)
{
	if (access == OAT_FUNCTION_EXECUTE && classId == ProcedureRelationId && storage_limited())
		guard_storage_function(objectId);
	if (prev_object_access)
		prev_object_access(access, classId, objectId, subId, arg);
}

/*
 * dbcloud_guard_client_auth refuses logins while the service is sealed
 * (ended.c), and logs each authentication of a database
 * credential (dbcloud_cred_*): dbcloud reads a credential's last login
 * from these lines, taking only those whose log "user" (the login role,
 * which no session changes) is the role named, so that no session's RAISE
 * forges one. Only credentials: log_connections would log every login,
 * dbcloud's own checks every few seconds among them, into the tenant's
 * logs.
 */
static void
dbcloud_guard_client_auth(Port *port, int status)
{
	if (prev_client_auth)
		prev_client_auth(port, status);
	/*
	 * The seal (ended.c) lets in what the sealed pg_hba.conf does:
	 * dbcloud's superuser over the unix socket, where only peer identity
	 * lets it in; refused before a credential's login is logged.
	 */
	if (status == STATUS_OK &&
		!(port->raddr.addr.ss_family == AF_UNIX && port->user_name != NULL &&
		  strcmp(port->user_name, DBCLOUD_SUPERUSER) == 0))
		refuse_if_sealed();
	if (status == STATUS_OK && port->user_name != NULL &&
		strncmp(port->user_name, CREDENTIAL_PREFIX, strlen(CREDENTIAL_PREFIX)) == 0)
		ereport(LOG,
				(errmsg("%s%s database=%s", CREDENTIAL_LOGIN, port->user_name,
						port->database_name ? port->database_name : "")));
}

static void
dbcloud_guard_emit_log(ErrorData *edata)
{
	give_end_reason(edata);
	if (prev_emit_log)
		prev_emit_log(edata);
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
							 NULL, &guard_ro_connection, false,
							 PGC_BACKEND, 0, NULL, NULL, NULL);
	DefineCustomBoolVariable(RO_ROLE,
							 "Makes every session of the role read-only; set with ALTER ROLE by the role's administrator.",
							 NULL, &guard_ro_role, false,
							 PGC_USERSET, 0, check_read_only_role, NULL, NULL);
	DefineCustomBoolVariable(STORAGE_RO,
							 "Refuses writes that add data to non-superusers: the service is near its storage limit.",
							 "Set by dbcloud in postgresql.conf; reloaded, never set in a session.",
							 &guard_storage_ro, false,
							 PGC_SIGHUP, 0, NULL, assign_storage_read_only, NULL);
	MarkGUCPrefixReserved("tsdb_admin");
	MarkGUCPrefixReserved("dbcloud_guard");

	prev_utility = ProcessUtility_hook;
	ProcessUtility_hook = dbcloud_guard_utility;
	RegisterXactCallback(guard_read_only_xact, NULL);
	prev_executor_start = ExecutorStart_hook;
	ExecutorStart_hook = dbcloud_guard_executor_start;
	prev_object_access = object_access_hook;
	object_access_hook = dbcloud_guard_object_access;
	prev_client_auth = ClientAuthentication_hook;
	ClientAuthentication_hook = dbcloud_guard_client_auth;
	prev_emit_log = emit_log_hook;
	emit_log_hook = dbcloud_guard_emit_log;
}
