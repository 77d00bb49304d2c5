/*
 * dbcloud_guard.h: what the guard's parts (dbcloud_guard.c: hooks and
 * settings; roles.c: reserved roles and role settings; readonly.c:
 * read-only sessions; storage.c: storage read-only) share.
 */
#ifndef DBCLOUD_GUARD_H
#define DBCLOUD_GUARD_H

#include "access/xact.h"
#include "executor/executor.h"
#include "nodes/parsenodes.h"
#include "utils/guc.h"

#define RO_CONNECTION "tsdb_admin.read_only_connection"
#define RO_ROLE "tsdb_admin.read_only_role"
#define STORAGE_RO "dbcloud_guard.storage_read_only"
/* Database credentials' roles (postgres.CredentialPrefix in Go). */
#define CREDENTIAL_PREFIX "dbcloud_cred_"
/* How a credential's login starts in the log (connectionAuthorized in Go). */
#define CREDENTIAL_LOGIN "credential login: user="
/* The pooler's lookup database (postgres.PoolerDatabase in Go). */
#define DBCLOUD_DATABASE "dbcloud"

/* The settings (dbcloud_guard.c). */
extern bool guard_ro_connection;
extern bool guard_ro_role;
extern bool guard_storage_ro;

extern void guard_refuse(const char *what, const char *why);

/* roles.c: reserved roles, predefined roles' membership, role settings. */
extern bool reserved_role(const char *name);
extern bool reserved_new_role_name(const char *name);
extern void guard_role_utility(Node *stmt);
extern bool is_ro_setting(const char *name);

/* readonly.c: read-only sessions (tsdb_admin.*). */
extern bool session_read_only(void);
extern void guard_read_only(Node *stmt);
extern void force_read_only(void);
extern void guard_read_only_xact(XactEvent event, void *arg);
extern bool check_read_only_role(bool *newval, void **extra, GucSource source);

/* storage.c: storage read-only (dbcloud_guard.storage_read_only). */
extern bool storage_limited(void);
extern void guard_storage_utility(Node *stmt);
extern void guard_storage_executor(QueryDesc *queryDesc);
extern void guard_storage_function(Oid fn);
extern void assign_storage_read_only(bool newval, void *extra);

/* ended.c: the reason dbcloud gives the sessions it ends, and the seal. */
#define END_REASON_FILE "dbcloud_end_reason"
#define SEAL_FILE "dbcloud_sealed"
/* dbcloud's superuser, let in by peer identity only (renderHBA in Go). */
#define DBCLOUD_SUPERUSER "postgres"
extern void give_end_reason(ErrorData *edata);
extern void refuse_if_sealed(void);

#endif
