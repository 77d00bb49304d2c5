/*
 * roles.c: the roles a tenant may not become, grant, create or change, and
 * the settings it may not attach to a database or a role.
 *
 * Reserved roles belong to dbcloud (postgres, dbcloud_*) and to PostgreSQL
 * (pg_*). Of PostgreSQL's predefined roles, a tenant may hold only those
 * that reach nothing it does not own (grantable_predefined below); every
 * other one, and any role that is a member of one, cannot be granted:
 * docs/security.md has the table, role by role.
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/table.h"
#include "access/transam.h"
#include "catalog/pg_authid.h"
#include "common/unicode_norm.h"
#include "lib/stringinfo.h"
#include "mb/pg_wchar.h"
#include "miscadmin.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/rel.h"

#include "dbcloud_guard.h"

/*
 * The predefined roles a tenant may grant. They read the statistics and
 * settings of the tenant's own instance (every session on it is the
 * tenant's or dbcloud's), take ACCESS SHARE locks to read them, or signal
 * the tenant's own roles' sessions (PostgreSQL keeps superusers' sessions
 * out of pg_signal_backend's reach). Any other predefined role, among them
 * those a later PostgreSQL adds, is refused until judged.
 */
static const char *const grantable_predefined[] = {
	"pg_monitor", "pg_read_all_settings", "pg_read_all_stats",
	"pg_stat_scan_tables", "pg_signal_backend",
};

/*
 * reserved_role: the roles dbcloud owns: the superuser, its own roles
 * (the pooler's lookup role, the replicator and any later dbcloud_*), and
 * PostgreSQL's predefined pg_* roles, which only the superuser may change.
 * Exact names, as PostgreSQL resolves an existing role's name.
 */
bool
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

/*
 * invisible: code points that show as nothing or as a blank: controls,
 * format characters (zero-width space and joiners, direction marks, the
 * byte order mark, soft hyphen, variation selectors, tags) and every space
 * but U+0020, which NFKC does not already map to U+0020.
 */
static bool
invisible(pg_wchar c)
{
	return c < 0x20 || (c >= 0x7F && c <= 0x9F) || c == 0xAD || c == 0x34F ||
		c == 0x61C || c == 0x115F || c == 0x1160 || c == 0x1680 ||
		c == 0x17B4 || c == 0x17B5 || (c >= 0x180B && c <= 0x180F) ||
		(c >= 0x2000 && c <= 0x200F) || (c >= 0x2028 && c <= 0x202F) ||
		(c >= 0x205F && c <= 0x206F) || c == 0x3000 || c == 0x3164 ||
		(c >= 0xFE00 && c <= 0xFE0F) || c == 0xFEFF || c == 0xFFA0 ||
		(c >= 0x1D173 && c <= 0x1D17A) || (c >= 0xE0000 && c <= 0xE0FFF);
}

/*
 * fold_role_name is what a reserved name is compared after: NFKC (so
 * full-width letters and ligatures become their plain letters), invisible
 * code points dropped wherever they are, spaces trimmed at both ends, and
 * ASCII letters lowercased. "postgres ", "Postgres", "ＰＯＳＴＧＲＥＳ" and
 * "DBCLOUD_POOLER" all fold to a reserved name. Letters of other scripts
 * that merely look alike (a Cyrillic "о") are not folded.
 */
static char *
fold_role_name(const char *name)
{
	StringInfoData out;
	int			len = strlen(name);
	int			start,
				end,
				i;

	initStringInfo(&out);
	if (GetDatabaseEncoding() == PG_UTF8)
	{
		pg_wchar   *w = palloc((len + 1) * sizeof(pg_wchar));
		pg_wchar   *norm;
		int			n = pg_mb2wchar_with_len(name, w, len);

		w[n] = 0;
		norm = unicode_normalize(UNICODE_NFKC, w);
		for (i = 0; norm != NULL && norm[i] != 0; i++)
		{
			unsigned char buf[8];

			if (invisible(norm[i]))
				continue;
			unicode_to_utf8(norm[i], buf);
			appendBinaryStringInfo(&out, (char *) buf, pg_utf_mblen(buf));
		}
	}
	else
		appendStringInfoString(&out, name);
	for (start = 0; start < out.len && out.data[start] == ' '; start++)
		;
	for (end = out.len; end > start && out.data[end - 1] == ' '; end--)
		;
	out.data[end] = '\0';
	for (i = start; i < end; i++)
		out.data[i] = pg_ascii_tolower(out.data[i]);
	return out.data + start;
}

/* reserved_new_role_name: a name a role may not be created or renamed to. */
bool
reserved_new_role_name(const char *name)
{
	return name != NULL && (reserved_role(name) || reserved_role(fold_role_name(name)));
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

static bool
grantable_predefined_role(const char *name)
{
	int			i;

	for (i = 0; i < lengthof(grantable_predefined); i++)
		if (strcmp(name, grantable_predefined[i]) == 0)
			return true;
	return false;
}

/*
 * refused_by_itself: membership in this role reaches beyond the tenant's
 * own objects: the superuser, dbcloud's roles, a predefined role not
 * judged harmless. pg_database_owner is left to PostgreSQL (it has no
 * explicit members; the owner of the current database is one implicitly,
 * holding nothing more than what it owns).
 */
static bool
refused_by_itself(Oid oid, const char *name, bool super)
{
	if (super || platform_role(name))
		return true;
	return oid < FirstNormalObjectId && strncmp(name, "pg_", 3) == 0 &&
		oid != ROLE_PG_DATABASE_OWNER && !grantable_predefined_role(name);
}

/*
 * member_of_refused: the role is, directly or through other roles, a
 * member of a role refused by itself (a superuser may have made such
 * memberships; a tenant cannot).
 */
static bool
member_of_refused(Oid oid)
{
	Relation	rel = table_open(AuthIdRelationId, AccessShareLock);
	SysScanDesc scan = systable_beginscan(rel, InvalidOid, false, NULL, 0, NULL);
	HeapTuple	tup;
	bool		found = false;

	while (!found && HeapTupleIsValid(tup = systable_getnext(scan)))
	{
		Form_pg_authid a = (Form_pg_authid) GETSTRUCT(tup);

		if (a->oid != oid && refused_by_itself(a->oid, NameStr(a->rolname), a->rolsuper))
			found = is_member_of_role_nosuper(oid, a->oid);
	}
	systable_endscan(scan);
	table_close(rel, AccessShareLock);
	return found;
}

/* refused_membership reports whether the named role may not be granted. */
static bool
refused_membership(const char *name)
{
	Oid			oid;

	if (name == NULL)
		return false;
	if (platform_role(name))
		return true;
	oid = get_role_oid(name, true);
	if (!OidIsValid(oid))
		return strncmp(name, "pg_", 3) == 0 && !grantable_predefined_role(name);
	return refused_by_itself(oid, name, superuser_arg(oid)) || member_of_refused(oid);
}

static void
check_granted(const char *name)
{
	if (refused_membership(name))
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("membership in role \"%s\" is reserved to the platform", name),
				 errdetail("Predefined roles other than pg_monitor, pg_read_all_settings, pg_read_all_stats, pg_stat_scan_tables and pg_signal_backend, roles that are members of them, the superuser and dbcloud's own roles cannot be granted: they reach data, files or programs beyond the tenant's own objects, or belong to dbcloud."),
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

/* check_new_name: CREATE ROLE and RENAME TO, compared after folding. */
static void
check_new_name(const char *name, const char *verb)
{
	if (reserved_new_role_name(name))
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("role name \"%s\" is reserved to the platform and cannot be %s", name, verb),
				 errdetail("Names that are postgres, or start with dbcloud_ or pg_, once lowercased, normalized (NFKC) and stripped of invisible characters and surrounding spaces, belong to dbcloud and PostgreSQL."),
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

bool
is_ro_setting(const char *name)
{
	return name != NULL &&
		(pg_strcasecmp(name, RO_CONNECTION) == 0 ||
		 pg_strcasecmp(name, RO_ROLE) == 0);
}

/*
 * check_attached_setting checks a setting attached to a database or role
 * (ALTER DATABASE/ROLE ... SET). Preloaded libraries load at every
 * connection of that database or role before any statement: a wrong one
 * refuses every login there, dbcloud's superuser's included (a resize then
 * retries for ever) or the tenant's own. The read-only settings are per
 * role, set by the role's administrator: on a database or on every role
 * they would reach dbcloud's sessions too.
 */
static void
check_attached_setting(VariableSetStmt *v, bool every_role)
{
	if (v == NULL || v->name == NULL || v->kind == VAR_RESET || v->kind == VAR_RESET_ALL)
		return;
	if (pg_strcasecmp(v->name, "local_preload_libraries") == 0 ||
		pg_strcasecmp(v->name, "session_preload_libraries") == 0)
		guard_refuse(psprintf("setting %s on a database or role", v->name),
					 "Libraries loaded when a session starts are chosen by the platform; a wrong one refuses every login to the database or role.");
	if (every_role && is_ro_setting(v->name))
		guard_refuse("setting tsdb_admin read-only settings on a database or on every role",
					 "Read-only is set per role (ALTER ROLE r SET tsdb_admin.read_only_role = true) or per connection.");
}

static void
guard_alter_role_set(AlterRoleSetStmt *s)
{
	char	   *name = rolespec_name(s->role);
	Oid			oid = s->role ? get_rolespec_oid(s->role, true) : InvalidOid;

	if (s->role != NULL)
		check_reserved(name, "altered");
	check_attached_setting(s->setstmt, s->role == NULL);
	if ((s->setstmt->name == NULL || is_ro_setting(s->setstmt->name)) &&
		OidIsValid(oid) && (oid == GetUserId() || oid == GetSessionUserId() || oid == GetOuterUserId()))
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("a role cannot change its own read-only setting"),
				 errdetail("tsdb_admin.read_only_role is set and reset by the role's administrator (such as tsdbadmin), never by the role itself."),
				 errhint("These are reserved to the platform (dbcloud_guard).")));
}

static void
guard_alter_role(AlterRoleStmt *s)
{
	ListCell   *lc;

	check_reserved(rolespec_name(s->role), "altered");
	if (s->action <= 0)
		return;
	check_role_options(s->options);
	/* ALTER GROUP g ADD USER u grants g: */
	foreach(lc, s->options)
		if (strcmp(((DefElem *) lfirst(lc))->defname, "rolemembers") == 0)
			check_granted(rolespec_name(s->role));
}

/*
 * check_new_database_name refuses a tenant's database named like dbcloud's
 * own: PgBouncer runs its sign-in lookup in the database "dbcloud"
 * (auth_dbname), which dbcloud makes and keeps out of the tenant's reach.
 * One the tenant made first would hold the lookup function of its choice.
 */
static void
check_new_database_name(const char *name)
{
	if (name != NULL && strcmp(name, DBCLOUD_DATABASE) == 0)
		guard_refuse(psprintf("a database named \"%s\"", name),
					 "That name is reserved to the platform's connection pooler.");
}

/*
 * credential_session: the session logged in as a database credential
 * (dbcloud_cred_<id>, made by dbcloud). A READ_WRITE one acts with
 * tsdbadmin's privileges while it lives, but nothing it does may outlive
 * it as a login: it may not create, change, rename, drop or grant roles,
 * whatever role it has taken (SET ROLE tsdbadmin) and in whatever function
 * it runs (a SECURITY DEFINER function it made and gave to tsdbadmin). The
 * authenticated user is the role that logged in, which nothing in the
 * session changes.
 */
static bool
credential_session(void)
{
	char	   *name = GetUserNameFromId(GetAuthenticatedUserId(), true);

	return name != NULL && strncmp(name, CREDENTIAL_PREFIX, strlen(CREDENTIAL_PREFIX)) == 0;
}

static bool
role_statement(Node *stmt)
{
	switch (nodeTag(stmt))
	{
		case T_CreateRoleStmt:
		case T_AlterRoleStmt:
		case T_AlterRoleSetStmt:
		case T_DropRoleStmt:
		case T_GrantRoleStmt:
			return true;
		case T_RenameStmt:
			return ((RenameStmt *) stmt)->renameType == OBJECT_ROLE;
		default:
			return false;
	}
}

/* guard_role_utility: the role statements' part of the tenant guard. */
void
guard_role_utility(Node *stmt)
{
	if (role_statement(stmt) && credential_session())
		guard_refuse("Managing roles from a database credential",
					 "A credential's access ends when it expires or is revoked; a role it made, changed or granted would outlive it. Roles are managed as tsdbadmin.");
	switch (nodeTag(stmt))
	{
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

				check_new_name(s->role, "created");
				check_role_options(s->options);
				break;
			}
		case T_AlterRoleStmt:
			guard_alter_role((AlterRoleStmt *) stmt);
			break;
		case T_AlterRoleSetStmt:
			guard_alter_role_set((AlterRoleSetStmt *) stmt);
			break;
		case T_CreatedbStmt:
			check_new_database_name(((CreatedbStmt *) stmt)->dbname);
			break;
		case T_AlterDatabaseSetStmt:
			check_attached_setting(((AlterDatabaseSetStmt *) stmt)->setstmt, true);
			break;
		case T_DropRoleStmt:
			check_role_list(((DropRoleStmt *) stmt)->roles, "dropped");
			break;
		case T_RenameStmt:
			{
				RenameStmt *s = (RenameStmt *) stmt;

				if (s->renameType == OBJECT_DATABASE)
					check_new_database_name(s->newname);
				if (s->renameType == OBJECT_ROLE)
				{
					check_reserved(s->subname, "renamed");
					check_new_name(s->newname, "used as a new name");
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
