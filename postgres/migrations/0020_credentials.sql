-- Database credentials (issue 35, decisions.md section 12): a row per
-- credential until the runtime has dropped its role.
CREATE TABLE credentials (
	id         TEXT COLLATE "C" PRIMARY KEY,
	project_id TEXT COLLATE "C" NOT NULL,
	service_id TEXT COLLATE "C" NOT NULL,
	created    TEXT COLLATE "C" NOT NULL,
	doc        JSON NOT NULL
);
CREATE INDEX credentials_service ON credentials (project_id, service_id, created, id);
