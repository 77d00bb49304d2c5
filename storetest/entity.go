package storetest

import (
	"testing"

	"dbcloud"
)

func testUser(t *testing.T, newDB NewDB) {
	s := MustOpen(t, newDB)
	// Inserted out of order; u3 and u2 share a time, so id breaks the tie.
	u1, u2, u3 := newUser("u1", at(1)), newUser("u2", at(2)), newUser("u0", at(2))
	insert(t, s, dbcloud.Tx.InsertUser, u2, u1, u3)

	t.Run("OK", func(t *testing.T) {
		equal(t, "FindUser", view(t, s, func(tx dbcloud.Tx) (*dbcloud.User, error) { return tx.FindUser("u2") }), u2)
		equal(t, "ListUsers", view(t, s, dbcloud.Tx.ListUsers), []*dbcloud.User{u1, u3, u2})
	})
	t.Run("ErrNotFound", func(t *testing.T) {
		_ = s.View(t.Context(), func(tx dbcloud.Tx) error {
			_, err := tx.FindUser("nope")
			wantNotFound(t, "FindUser", err)
			return nil
		})
	})
	t.Run("ErrDuplicate", func(t *testing.T) {
		err := update(t, s, func(tx dbcloud.Tx) error { return tx.InsertUser(newUser("u1", at(9))) })
		wantDuplicate(t, "InsertUser", err)
	})
}

func testProject(t *testing.T, newDB NewDB) {
	s := MustOpen(t, newDB)
	p1, p2 := newProject("p1", at(2)), newProject("p2", at(1))
	insert(t, s, dbcloud.Tx.InsertProject, p1, p2)

	t.Run("OK", func(t *testing.T) {
		equal(t, "FindProject", view(t, s, func(tx dbcloud.Tx) (*dbcloud.Project, error) { return tx.FindProject("p1") }), p1)
		equal(t, "ListProjects", view(t, s, dbcloud.Tx.ListProjects), []*dbcloud.Project{p2, p1})
	})
	t.Run("Update", func(t *testing.T) {
		p := newProject("p3", at(3))
		insert(t, s, dbcloud.Tx.InsertProject, p)
		p.Quota = &dbcloud.ResourceQuota{Instances: 3, CPUMillis: 2000, MemoryGBs: 8, StorageGBs: 20}
		insert(t, s, dbcloud.Tx.UpdateProject, p)
		equal(t, "FindProject after update", view(t, s, func(tx dbcloud.Tx) (*dbcloud.Project, error) { return tx.FindProject("p3") }), p)
		err := update(t, s, func(tx dbcloud.Tx) error { return tx.UpdateProject(newProject("nope", at(1))) })
		wantNotFound(t, "UpdateProject", err)
	})
	t.Run("Empty", func(t *testing.T) {
		s := MustOpen(t, newDB)
		got := view(t, s, dbcloud.Tx.ListProjects)
		if got == nil || len(got) != 0 {
			t.Errorf("ListProjects of an empty store = %#v, want an empty non-nil slice", got)
		}
	})
	t.Run("LockProject", func(t *testing.T) {
		// Locking works for existing and not (yet) existing projects, and
		// twice in one transaction.
		MustUpdate(t, s, func(tx dbcloud.Tx) error {
			for _, id := range []string{"p1", "p1", "not-yet"} {
				if err := tx.LockProject(id); err != nil {
					return err
				}
			}
			return nil
		})
	})
	t.Run("ErrNotFound", func(t *testing.T) {
		_ = s.View(t.Context(), func(tx dbcloud.Tx) error {
			_, err := tx.FindProject("nope")
			wantNotFound(t, "FindProject", err)
			return nil
		})
	})
	t.Run("ErrDuplicate", func(t *testing.T) {
		err := update(t, s, func(tx dbcloud.Tx) error { return tx.InsertProject(newProject("p2", at(5))) })
		wantDuplicate(t, "InsertProject", err)
	})
}

func testAPIKey(t *testing.T, newDB NewDB) {
	s := MustOpen(t, newDB)
	k1, k2, k3 := newAPIKey("p1", "AK1", at(3)), newAPIKey("p1", "AK2", at(1)), newAPIKey("p2", "AK3", at(2))
	k2.Revoked = nil
	insert(t, s, dbcloud.Tx.InsertAPIKey, k1, k2, k3)
	find := func(ak string) func(dbcloud.Tx) (*dbcloud.APIKey, error) {
		return func(tx dbcloud.Tx) (*dbcloud.APIKey, error) { return tx.FindAPIKey(ak) }
	}

	t.Run("OK", func(t *testing.T) {
		// SecretHash is json:"-" and must still round-trip.
		equal(t, "FindAPIKey", view(t, s, find("AK1")), k1)
		equal(t, "FindAPIKey", view(t, s, find("AK2")), k2)
		list := func(p string) func(dbcloud.Tx) ([]*dbcloud.APIKey, error) {
			return func(tx dbcloud.Tx) ([]*dbcloud.APIKey, error) { return tx.ListAPIKeys(p) }
		}
		equal(t, "ListAPIKeys(p1)", view(t, s, list("p1")), []*dbcloud.APIKey{k2, k1})
		equal(t, "ListAPIKeys(p2)", view(t, s, list("p2")), []*dbcloud.APIKey{k3})
		equal(t, "ListAPIKeys(none)", view(t, s, list("none")), []*dbcloud.APIKey{})
	})
	t.Run("Update", func(t *testing.T) {
		k := newAPIKey("p1", "AK9", at(1))
		k.Revoked = nil
		insert(t, s, dbcloud.Tx.InsertAPIKey, k)
		k.Revoked = ptr(at(10))
		k.Name = "renamed"
		k.SecretHash = dbcloud.HashSecret("rotated")
		insert(t, s, dbcloud.Tx.UpdateAPIKey, k)
		equal(t, "FindAPIKey after update", view(t, s, find("AK9")), k)
	})
	t.Run("ErrNotFound", func(t *testing.T) {
		_ = s.View(t.Context(), func(tx dbcloud.Tx) error {
			_, err := tx.FindAPIKey("nope")
			wantNotFound(t, "FindAPIKey", err)
			return nil
		})
		err := update(t, s, func(tx dbcloud.Tx) error { return tx.UpdateAPIKey(newAPIKey("p1", "nope", at(1))) })
		wantNotFound(t, "UpdateAPIKey", err)
	})
	t.Run("ErrDuplicate", func(t *testing.T) {
		err := update(t, s, func(tx dbcloud.Tx) error { return tx.InsertAPIKey(newAPIKey("p9", "AK1", at(1))) })
		wantDuplicate(t, "InsertAPIKey", err)
	})
}

func testService(t *testing.T, newDB NewDB) {
	s := MustOpen(t, newDB)
	a, b, c := NewService("p1", "svc-b", at(1)), NewService("p1", "svc-a", at(1)), NewService("p1", "svc-0", at(2))
	other := NewService("p2", "svc-x", at(0))
	insert(t, s, dbcloud.Tx.InsertService, c, a, other, b)
	find := func(p, id string) func(dbcloud.Tx) (*dbcloud.Service, error) {
		return func(tx dbcloud.Tx) (*dbcloud.Service, error) { return tx.FindService(p, id) }
	}
	list := func(p string) func(dbcloud.Tx) ([]*dbcloud.Service, error) {
		return func(tx dbcloud.Tx) ([]*dbcloud.Service, error) { return tx.ListServices(p) }
	}

	t.Run("OK", func(t *testing.T) {
		equal(t, "FindService", view(t, s, find("p1", "svc-a")), b)
		// Oldest first; svc-a and svc-b were created at once, so by ID.
		equal(t, "ListServices(p1)", view(t, s, list("p1")), []*dbcloud.Service{b, a, c})
		equal(t, "ListServices(p2)", view(t, s, list("p2")), []*dbcloud.Service{other})
		equal(t, "ListServices(none)", view(t, s, list("none")), []*dbcloud.Service{})
	})
	t.Run("Minimal", func(t *testing.T) {
		// Nil optional fields stay nil rather than coming back as zero values.
		m := &dbcloud.Service{ID: "svc-min", ProjectID: "p3", Created: at(1)}
		insert(t, s, dbcloud.Tx.InsertService, m)
		equal(t, "FindService", view(t, s, find("p3", "svc-min")), m)
	})
	t.Run("Update", func(t *testing.T) {
		u := NewService("p4", "svc-u", at(1))
		insert(t, s, dbcloud.Tx.InsertService, u)
		u.Status, u.Generation, u.Fork, u.Instances = dbcloud.StatusReady, 8, nil, nil
		u.Spec.Addons = nil
		insert(t, s, dbcloud.Tx.UpdateService, u)
		equal(t, "FindService after update", view(t, s, find("p4", "svc-u")), u)
	})
	t.Run("PGVersion", func(t *testing.T) {
		// The version a service runs is kept through updates, in its
		// document and its column alike.
		v := NewService("p6", "svc-v", at(1))
		v.Spec.PGVersion, v.PGVersionFull = 15, "15.20"
		insert(t, s, dbcloud.Tx.InsertService, v)
		equal(t, "FindService", view(t, s, find("p6", "svc-v")), v)
		v.Spec.PGVersion, v.PGVersionFull = 17, "17.12"
		insert(t, s, dbcloud.Tx.UpdateService, v)
		equal(t, "FindService after update", view(t, s, find("p6", "svc-v")), v)
	})
	t.Run("Delete", func(t *testing.T) {
		d := NewService("p5", "svc-d", at(1))
		insert(t, s, dbcloud.Tx.InsertService, d)
		MustUpdate(t, s, func(tx dbcloud.Tx) error { return tx.DeleteService("p5", "svc-d") })
		equal(t, "ListServices after delete", view(t, s, list("p5")), []*dbcloud.Service{})
	})
	t.Run("ErrNotFound", func(t *testing.T) {
		_ = s.View(t.Context(), func(tx dbcloud.Tx) error {
			_, err := tx.FindService("p1", "nope")
			wantNotFound(t, "FindService", err)
			_, err = tx.FindService("p2", "svc-a") // exists, in another project
			wantNotFound(t, "FindService of another project", err)
			return nil
		})
		err := update(t, s, func(tx dbcloud.Tx) error { return tx.UpdateService(NewService("p1", "nope", at(1))) })
		wantNotFound(t, "UpdateService", err)
		err = update(t, s, func(tx dbcloud.Tx) error { return tx.UpdateService(NewService("p2", "svc-a", at(1))) })
		wantNotFound(t, "UpdateService of another project", err)
		err = update(t, s, func(tx dbcloud.Tx) error { return tx.DeleteService("p1", "nope") })
		wantNotFound(t, "DeleteService", err)
		err = update(t, s, func(tx dbcloud.Tx) error { return tx.DeleteService("p2", "svc-a") })
		wantNotFound(t, "DeleteService of another project", err)
	})
	t.Run("ErrDuplicate", func(t *testing.T) {
		// IDs are unique across projects.
		err := update(t, s, func(tx dbcloud.Tx) error { return tx.InsertService(NewService("p9", "svc-a", at(1))) })
		wantDuplicate(t, "InsertService", err)
	})
}

func testReplicaSet(t *testing.T, newDB NewDB) {
	s := MustOpen(t, newDB)
	r1 := newReplicaSet("p1", "svc1", "rs1", at(3))
	r2 := newReplicaSet("p1", "svc2", "rs2", at(2))
	r3 := newReplicaSet("p1", "svc1", "rs3", at(1))
	r4 := newReplicaSet("p2", "svc1", "rs4", at(0)) // same service ID, other project
	insert(t, s, dbcloud.Tx.InsertReplicaSet, r1, r2, r3, r4)
	find := func(p, id string) func(dbcloud.Tx) (*dbcloud.ReadReplicaSet, error) {
		return func(tx dbcloud.Tx) (*dbcloud.ReadReplicaSet, error) { return tx.FindReplicaSet(p, id) }
	}
	list := func(p, svc string) func(dbcloud.Tx) ([]*dbcloud.ReadReplicaSet, error) {
		return func(tx dbcloud.Tx) ([]*dbcloud.ReadReplicaSet, error) { return tx.ListReplicaSets(p, svc) }
	}

	t.Run("OK", func(t *testing.T) {
		equal(t, "FindReplicaSet", view(t, s, find("p1", "rs1")), r1)
	})
	t.Run("List", func(t *testing.T) {
		tests := []struct {
			project, service string
			want             []*dbcloud.ReadReplicaSet
		}{
			{"p1", "", []*dbcloud.ReadReplicaSet{r3, r2, r1}},
			{"p1", "svc1", []*dbcloud.ReadReplicaSet{r3, r1}},
			{"p1", "svc2", []*dbcloud.ReadReplicaSet{r2}},
			{"p2", "", []*dbcloud.ReadReplicaSet{r4}},
			{"p2", "svc2", []*dbcloud.ReadReplicaSet{}},
			{"none", "", []*dbcloud.ReadReplicaSet{}},
		}
		for _, tt := range tests {
			equal(t, "ListReplicaSets("+tt.project+", "+tt.service+")", view(t, s, list(tt.project, tt.service)), tt.want)
		}
	})
	t.Run("Update", func(t *testing.T) {
		u := newReplicaSet("p3", "svc1", "rs-u", at(1))
		insert(t, s, dbcloud.Tx.InsertReplicaSet, u)
		u.Status, u.Spec.Nodes, u.Endpoint = dbcloud.ReplicaSetActive, 5, nil
		insert(t, s, dbcloud.Tx.UpdateReplicaSet, u)
		equal(t, "FindReplicaSet after update", view(t, s, find("p3", "rs-u")), u)
	})
	t.Run("Delete", func(t *testing.T) {
		insert(t, s, dbcloud.Tx.InsertReplicaSet, newReplicaSet("p4", "svc1", "rs-d", at(1)))
		MustUpdate(t, s, func(tx dbcloud.Tx) error { return tx.DeleteReplicaSet("p4", "rs-d") })
		equal(t, "ListReplicaSets after delete", view(t, s, list("p4", "")), []*dbcloud.ReadReplicaSet{})
	})
	t.Run("ErrNotFound", func(t *testing.T) {
		_ = s.View(t.Context(), func(tx dbcloud.Tx) error {
			_, err := tx.FindReplicaSet("p2", "rs1")
			wantNotFound(t, "FindReplicaSet of another project", err)
			return nil
		})
		err := update(t, s, func(tx dbcloud.Tx) error { return tx.UpdateReplicaSet(newReplicaSet("p1", "svc1", "nope", at(1))) })
		wantNotFound(t, "UpdateReplicaSet", err)
		err = update(t, s, func(tx dbcloud.Tx) error { return tx.DeleteReplicaSet("p2", "rs1") })
		wantNotFound(t, "DeleteReplicaSet of another project", err)
	})
	t.Run("ErrDuplicate", func(t *testing.T) {
		err := update(t, s, func(tx dbcloud.Tx) error { return tx.InsertReplicaSet(newReplicaSet("p1", "svc9", "rs1", at(1))) })
		wantDuplicate(t, "InsertReplicaSet", err)
	})
}

func testVPC(t *testing.T, newDB NewDB) {
	s := MustOpen(t, newDB)
	v1, v2, v3 := newVPC("p1", "200", at(2)), newVPC("p1", "100", at(3)), newVPC("p2", "300", at(1))
	insert(t, s, dbcloud.Tx.InsertVPC, v1, v2, v3)
	find := func(p, id string) func(dbcloud.Tx) (*dbcloud.VPC, error) {
		return func(tx dbcloud.Tx) (*dbcloud.VPC, error) { return tx.FindVPC(p, id) }
	}
	list := func(p string) func(dbcloud.Tx) ([]*dbcloud.VPC, error) {
		return func(tx dbcloud.Tx) ([]*dbcloud.VPC, error) { return tx.ListVPCs(p) }
	}

	t.Run("OK", func(t *testing.T) {
		equal(t, "FindVPC", view(t, s, find("p1", "200")), v1)
		equal(t, "ListVPCs(p1)", view(t, s, list("p1")), []*dbcloud.VPC{v1, v2})
	})
	t.Run("Update", func(t *testing.T) {
		u := newVPC("p3", "400", at(1))
		insert(t, s, dbcloud.Tx.InsertVPC, u)
		u.Name = "renamed"
		insert(t, s, dbcloud.Tx.UpdateVPC, u)
		equal(t, "FindVPC after update", view(t, s, find("p3", "400")), u)
	})
	t.Run("Delete", func(t *testing.T) {
		insert(t, s, dbcloud.Tx.InsertVPC, newVPC("p4", "500", at(1)))
		MustUpdate(t, s, func(tx dbcloud.Tx) error { return tx.DeleteVPC("p4", "500") })
		equal(t, "ListVPCs after delete", view(t, s, list("p4")), []*dbcloud.VPC{})
	})
	t.Run("ErrNotFound", func(t *testing.T) {
		_ = s.View(t.Context(), func(tx dbcloud.Tx) error {
			_, err := tx.FindVPC("p2", "200")
			wantNotFound(t, "FindVPC of another project", err)
			return nil
		})
		err := update(t, s, func(tx dbcloud.Tx) error { return tx.UpdateVPC(newVPC("p2", "200", at(1))) })
		wantNotFound(t, "UpdateVPC of another project", err)
		err = update(t, s, func(tx dbcloud.Tx) error { return tx.DeleteVPC("p1", "999") })
		wantNotFound(t, "DeleteVPC", err)
	})
	t.Run("ErrDuplicate", func(t *testing.T) {
		err := update(t, s, func(tx dbcloud.Tx) error { return tx.InsertVPC(newVPC("p1", "300", at(1))) })
		wantDuplicate(t, "InsertVPC", err)
	})
}

func testPeering(t *testing.T, newDB NewDB) {
	s := MustOpen(t, newDB)
	e1, e2, e3 := newPeering("p1", "100", "11", at(2)), newPeering("p1", "100", "12", at(1)), newPeering("p1", "200", "13", at(0))
	insert(t, s, dbcloud.Tx.InsertPeering, e1, e2, e3)
	find := func(vpc, id string) func(dbcloud.Tx) (*dbcloud.Peering, error) {
		return func(tx dbcloud.Tx) (*dbcloud.Peering, error) { return tx.FindPeering(vpc, id) }
	}
	list := func(vpc string) func(dbcloud.Tx) ([]*dbcloud.Peering, error) {
		return func(tx dbcloud.Tx) ([]*dbcloud.Peering, error) { return tx.ListPeerings(vpc) }
	}

	t.Run("OK", func(t *testing.T) {
		equal(t, "FindPeering", view(t, s, find("100", "11")), e1)
		equal(t, "ListPeerings(100)", view(t, s, list("100")), []*dbcloud.Peering{e2, e1})
		equal(t, "ListPeerings(200)", view(t, s, list("200")), []*dbcloud.Peering{e3})
	})
	t.Run("Update", func(t *testing.T) {
		u := newPeering("p1", "300", "14", at(1))
		insert(t, s, dbcloud.Tx.InsertPeering, u)
		u.Status, u.ErrorMessage = dbcloud.PeeringActive, ""
		insert(t, s, dbcloud.Tx.UpdatePeering, u)
		equal(t, "FindPeering after update", view(t, s, find("300", "14")), u)
	})
	t.Run("Delete", func(t *testing.T) {
		insert(t, s, dbcloud.Tx.InsertPeering, newPeering("p1", "400", "15", at(1)))
		MustUpdate(t, s, func(tx dbcloud.Tx) error { return tx.DeletePeering("400", "15") })
		equal(t, "ListPeerings after delete", view(t, s, list("400")), []*dbcloud.Peering{})
	})
	t.Run("ErrNotFound", func(t *testing.T) {
		_ = s.View(t.Context(), func(tx dbcloud.Tx) error {
			_, err := tx.FindPeering("200", "11")
			wantNotFound(t, "FindPeering of another VPC", err)
			return nil
		})
		err := update(t, s, func(tx dbcloud.Tx) error { return tx.UpdatePeering(newPeering("p1", "200", "11", at(1))) })
		wantNotFound(t, "UpdatePeering of another VPC", err)
		err = update(t, s, func(tx dbcloud.Tx) error { return tx.DeletePeering("200", "11") })
		wantNotFound(t, "DeletePeering of another VPC", err)
	})
	t.Run("ErrDuplicate", func(t *testing.T) {
		err := update(t, s, func(tx dbcloud.Tx) error { return tx.InsertPeering(newPeering("p1", "200", "11", at(1))) })
		wantDuplicate(t, "InsertPeering", err)
	})
}

func testOperation(t *testing.T, newDB NewDB) {
	s := MustOpen(t, newDB)
	opID := func(o *dbcloud.Operation) string { return o.ID }
	// o3 and o2 share a time; o1 is oldest.
	o1 := newOperation("p1", "svc1", "op1", dbcloud.OpSucceeded, at(1))
	o2 := newOperation("p1", "svc1", "op3", dbcloud.OpPending, at(2))
	o3 := newOperation("p1", "svc2", "op2", dbcloud.OpPending, at(2))
	o4 := newOperation("p2", "svc1", "op4", dbcloud.OpFailed, at(3))
	o5 := newOperation("p1", "svc1", "op5", dbcloud.OpPending, at(4))
	// Stores must keep any string, even one PostgreSQL's jsonb refuses.
	o5.Error = "nul \x00 byte, quote \" and unicode é"
	insert(t, s, dbcloud.Tx.InsertOperation, o5, o4, o3, o2, o1)

	t.Run("OK", func(t *testing.T) {
		got := view(t, s, func(tx dbcloud.Tx) (*dbcloud.Operation, error) { return tx.FindOperation("op5") })
		equal(t, "FindOperation", got, o5)
	})
	t.Run("Filter", func(t *testing.T) {
		tests := []struct {
			filter dbcloud.OperationFilter
			want   []string
		}{
			{dbcloud.OperationFilter{}, []string{"op1", "op2", "op3", "op4", "op5"}},
			{dbcloud.OperationFilter{Limit: 2}, []string{"op1", "op2"}},
			{dbcloud.OperationFilter{Pending: true}, []string{"op2", "op3", "op5"}},
			{dbcloud.OperationFilter{Pending: true, Limit: 1}, []string{"op2"}},
			{dbcloud.OperationFilter{ResourceID: "svc1"}, []string{"op1", "op3", "op4", "op5"}},
			{dbcloud.OperationFilter{ResourceID: "svc1", Pending: true}, []string{"op3", "op5"}},
			{dbcloud.OperationFilter{ResourceID: "svc1", Pending: true, Limit: 1}, []string{"op3"}},
			{dbcloud.OperationFilter{ResourceID: "svc2", Limit: 5}, []string{"op2"}},
			{dbcloud.OperationFilter{ResourceID: "none"}, []string{}},
		}
		for _, tt := range tests {
			got := view(t, s, func(tx dbcloud.Tx) ([]*dbcloud.Operation, error) { return tx.ListOperations(tt.filter) })
			equal(t, "ListOperations IDs "+show(tt.filter), ids(got, opID), tt.want)
		}
		all := view(t, s, func(tx dbcloud.Tx) ([]*dbcloud.Operation, error) {
			return tx.ListOperations(dbcloud.OperationFilter{})
		})
		equal(t, "ListOperations", all, []*dbcloud.Operation{o1, o3, o2, o4, o5})
	})
	t.Run("Update", func(t *testing.T) {
		// Finishing an operation takes it out of the pending list.
		u := newOperation("p3", "svc-u", "op-u", dbcloud.OpPending, at(1))
		insert(t, s, dbcloud.Tx.InsertOperation, u)
		u.State, u.Attempts, u.LeaseOwner, u.Updated = dbcloud.OpSucceeded, 3, "", at(9)
		insert(t, s, dbcloud.Tx.UpdateOperation, u)
		got := view(t, s, func(tx dbcloud.Tx) (*dbcloud.Operation, error) { return tx.FindOperation("op-u") })
		equal(t, "FindOperation after update", got, u)
		pending := view(t, s, func(tx dbcloud.Tx) ([]*dbcloud.Operation, error) {
			return tx.ListOperations(dbcloud.OperationFilter{ResourceID: "svc-u", Pending: true})
		})
		equal(t, "pending after update", ids(pending, opID), []string{})
	})
	t.Run("ErrNotFound", func(t *testing.T) {
		_ = s.View(t.Context(), func(tx dbcloud.Tx) error {
			_, err := tx.FindOperation("nope")
			wantNotFound(t, "FindOperation", err)
			return nil
		})
		err := update(t, s, func(tx dbcloud.Tx) error {
			return tx.UpdateOperation(newOperation("p1", "svc1", "nope", dbcloud.OpFailed, at(1)))
		})
		wantNotFound(t, "UpdateOperation", err)
	})
	t.Run("ErrDuplicate", func(t *testing.T) {
		err := update(t, s, func(tx dbcloud.Tx) error {
			return tx.InsertOperation(newOperation("p1", "svc1", "op1", dbcloud.OpPending, at(1)))
		})
		wantDuplicate(t, "InsertOperation", err)
	})
}

func testPort(t *testing.T, newDB NewDB) {
	s := MustOpen(t, newDB)
	ports := func(tx dbcloud.Tx) (map[int]string, error) { return tx.ListPorts() }

	t.Run("Empty", func(t *testing.T) {
		equal(t, "ListPorts", view(t, s, ports), map[int]string{})
	})
	t.Run("OK", func(t *testing.T) {
		MustUpdate(t, s, func(tx dbcloud.Tx) error {
			for port, owner := range map[int]string{15432: "svc1", 15433: "svc1", 15434: "svc2"} {
				if err := tx.ClaimPort(port, owner); err != nil {
					return err
				}
			}
			return nil
		})
		equal(t, "ListPorts", view(t, s, ports), map[int]string{15432: "svc1", 15433: "svc1", 15434: "svc2"})
	})
	t.Run("ErrDuplicate", func(t *testing.T) {
		err := update(t, s, func(tx dbcloud.Tx) error { return tx.ClaimPort(15434, "svc3") })
		wantDuplicate(t, "ClaimPort of a held port", err)
		err = update(t, s, func(tx dbcloud.Tx) error { return tx.ClaimPort(15434, "svc2") })
		wantDuplicate(t, "ClaimPort of a port the owner holds", err)
	})
	t.Run("Release", func(t *testing.T) {
		MustUpdate(t, s, func(tx dbcloud.Tx) error { return tx.ReleasePorts("svc1") })
		MustUpdate(t, s, func(tx dbcloud.Tx) error { return tx.ReleasePorts("nobody") })
		equal(t, "ListPorts after release", view(t, s, ports), map[int]string{15434: "svc2"})
		MustUpdate(t, s, func(tx dbcloud.Tx) error { return tx.ClaimPort(15432, "svc3") })
		equal(t, "ListPorts after reclaim", view(t, s, ports), map[int]string{15432: "svc3", 15434: "svc2"})
	})
}

func testIdempotency(t *testing.T, newDB NewDB) {
	s := MustOpen(t, newDB)
	find := func(cred, key string) func(dbcloud.Tx) (*dbcloud.IdempotencyRecord, error) {
		return func(tx dbcloud.Tx) (*dbcloud.IdempotencyRecord, error) { return tx.FindIdempotency(cred, key) }
	}

	t.Run("OK", func(t *testing.T) {
		r := newIdempotency("AK1", "k1", at(1))
		same := newIdempotency("AK2", "k1", at(1)) // same key, other caller
		insert(t, s, dbcloud.Tx.InsertIdempotency, r, same)
		equal(t, "FindIdempotency", view(t, s, find("AK1", "k1")), r)
		equal(t, "FindIdempotency of another caller", view(t, s, find("AK2", "k1")), same)

		pending := newIdempotency("AK1", "k2", at(1))
		pending.Status, pending.Response, pending.ResourceID, pending.ResourceKind = 0, nil, "", ""
		insert(t, s, dbcloud.Tx.InsertIdempotency, pending)
		equal(t, "FindIdempotency before the response", view(t, s, find("AK1", "k2")), pending)
		pending.Status, pending.Response = 201, []byte("sealed")
		insert(t, s, dbcloud.Tx.UpdateIdempotency, pending)
		equal(t, "FindIdempotency after update", view(t, s, find("AK1", "k2")), pending)
	})
	t.Run("ErrNotFound", func(t *testing.T) {
		_ = s.View(t.Context(), func(tx dbcloud.Tx) error {
			_, err := tx.FindIdempotency("AK3", "k1")
			wantNotFound(t, "FindIdempotency", err)
			return nil
		})
		err := update(t, s, func(tx dbcloud.Tx) error { return tx.UpdateIdempotency(newIdempotency("AK3", "k1", at(1))) })
		wantNotFound(t, "UpdateIdempotency", err)
	})
	t.Run("ErrDuplicate", func(t *testing.T) {
		insert(t, s, dbcloud.Tx.InsertIdempotency, newIdempotency("AK4", "k1", at(1)))
		err := update(t, s, func(tx dbcloud.Tx) error { return tx.InsertIdempotency(newIdempotency("AK4", "k1", at(2))) })
		wantDuplicate(t, "InsertIdempotency", err)
	})
	t.Run("DeleteBefore", func(t *testing.T) {
		s := MustOpen(t, newDB)
		insert(t, s, dbcloud.Tx.InsertIdempotency,
			newIdempotency("AK1", "old", at(1)),
			newIdempotency("AK1", "edge", at(5)),
			newIdempotency("AK2", "new", at(6)))
		var n int
		MustUpdate(t, s, func(tx dbcloud.Tx) (err error) {
			n, err = tx.DeleteIdempotencyBefore(at(5)) // strictly before
			return err
		})
		if n != 1 {
			t.Errorf("DeleteIdempotencyBefore deleted %d, want 1", n)
		}
		_ = s.View(t.Context(), func(tx dbcloud.Tx) error {
			_, err := tx.FindIdempotency("AK1", "old")
			wantNotFound(t, "FindIdempotency of a deleted key", err)
			for _, k := range [][2]string{{"AK1", "edge"}, {"AK2", "new"}} {
				if _, err := tx.FindIdempotency(k[0], k[1]); err != nil {
					t.Errorf("FindIdempotency(%s, %s) after delete: %v", k[0], k[1], err)
				}
			}
			return nil
		})
		MustUpdate(t, s, func(tx dbcloud.Tx) (err error) {
			n, err = tx.DeleteIdempotencyBefore(at(100))
			return err
		})
		if n != 2 {
			t.Errorf("second DeleteIdempotencyBefore deleted %d, want 2", n)
		}
	})
}
