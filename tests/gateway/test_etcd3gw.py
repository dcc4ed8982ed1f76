"""etcd3gw, the gateway client OpenStack uses (PyPI), against a three-member cairn cluster:
keys, prefixes, transactions, leases with their keys, locks, and watches, through each
member's gateway."""

import threading
import unittest

import etcd3gw

from cairn import Cluster, wait_for


class Etcd3gwTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.cluster = Cluster(3)

    @classmethod
    def tearDownClass(cls):
        cls.cluster.stop()

    def client(self, index=0):
        member = self.cluster.members[index]
        # No api_path: etcd3gw asks /version which API path to use.
        return etcd3gw.client(host="127.0.0.1", port=member.client_port, timeout=10)

    def test_keys_prefixes_and_transactions(self):
        c = self.client(0)
        self.assertEqual(c.api_path, "/v3/")
        self.assertTrue(c.put("/app/a", "1"))
        self.assertTrue(c.put("/app/b", "2"))
        # Written through one member, read through another.
        other = self.client(1)
        self.assertEqual(other.get("/app/a"), [b"1"])
        self.assertEqual(sorted(v for v, _ in other.get_prefix("/app/")), [b"1", b"2"])
        value, meta = other.get("/app/b", metadata=True)[0]
        self.assertEqual((value, meta["key"]), (b"2", b"/app/b"))
        self.assertTrue(c.create("/app/c", "3"))
        self.assertFalse(c.create("/app/c", "again"), "create refuses an existing key")
        self.assertTrue(c.replace("/app/c", "3", "4"))
        self.assertFalse(c.replace("/app/c", "3", "5"), "replace compares the value")
        self.assertEqual(c.get("/app/c"), [b"4"])
        self.assertTrue(c.delete("/app/a"))
        self.assertFalse(c.delete("/app/a"), "nothing left to delete")
        self.assertTrue(c.delete_prefix("/app/"))
        self.assertEqual(c.get_prefix("/app/"), [])
        self.assertEqual(len(c.members()), 3)
        self.assertIn("leader", c.status())

    def test_leases_and_their_keys(self):
        c = self.client(1)
        lease = c.lease(ttl=60)
        self.assertTrue(c.put("/leased/x", "v", lease=lease))
        self.assertEqual(lease.keys(), [b"/leased/x"])
        self.assertGreater(lease.refresh(), 0)
        self.assertGreater(lease.ttl(), 0)
        self.assertTrue(lease.revoke())
        self.assertEqual(c.get("/leased/x"), [])

    def test_locks_exclude_each_other(self):
        first = self.client(0).lock("job", ttl=60)
        second = self.client(2).lock("job", ttl=60)
        self.assertTrue(first.acquire())
        self.assertTrue(first.is_acquired())
        self.assertFalse(second.acquire(), "held by the first")
        self.assertTrue(first.release())
        self.assertTrue(second.acquire())
        self.assertTrue(second.release())

    def test_watches_see_puts_and_deletes(self):
        c = self.client(2)
        events, cancel = c.watch_prefix("/watched/")
        seen = []
        done = threading.Event()

        def consume():
            for event in events:
                seen.append((event.get("type", "PUT"), event["kv"]["key"]))
                if seen[-1][0] == "DELETE":
                    done.set()
                    return

        threading.Thread(target=consume, daemon=True).start()
        writer = self.client(0)

        # The watch is created asynchronously: write until its first event arrives.
        def first_event():
            writer.put("/watched/k", "v")
            return len(seen) >= 1

        wait_for("a watched put", first_event, every=0.2)
        writer.delete("/watched/k")
        self.assertTrue(done.wait(30))
        cancel()
        # Puts (as many as the writer made before the first was seen), then the delete.
        self.assertEqual(seen[-1], ("DELETE", b"/watched/k"))
        self.assertEqual(set(seen[:-1]), {("PUT", b"/watched/k")})


if __name__ == "__main__":
    unittest.main()
