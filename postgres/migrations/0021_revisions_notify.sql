-- Every change of a counter is announced on the channel dbcloud_revisions
-- (payload "SCOPE REV"), so that each control plane keeps the counters in
-- memory instead of reading them for every request. A trigger, not the
-- writer, sends it, so every writer of the table announces its changes
-- (dbcloud admin, a plane of another version). PostgreSQL delivers a
-- notification only once its transaction is committed and visible.
CREATE FUNCTION dbcloud_revisions_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('dbcloud_revisions', NEW.scope || ' ' || NEW.rev);
    RETURN NULL;
END
$$;

CREATE TRIGGER revisions_notify AFTER INSERT OR UPDATE ON revisions
    FOR EACH ROW EXECUTE FUNCTION dbcloud_revisions_notify();
