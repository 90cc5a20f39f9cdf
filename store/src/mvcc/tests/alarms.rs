//! The NOSPACE alarm.

use super::*;

#[test]
fn a_nospace_alarm_refuses_what_takes_space_and_nothing_else() {
    let s = new_store();
    put(&s, "a", "1");
    grant(&s, 7, 60);
    let raised = alarm(&s, true, 3);
    assert_eq!(
        raised.revision, 1,
        "an alarm is not a revision of the keyspace"
    );
    let nospace = Alarm {
        member: 3,
        kind: AlarmKind::NoSpace,
    };
    assert_eq!(raised.output, Ok(Output::Alarms(vec![nospace])));
    // Raising it again changes nothing.
    assert_eq!(alarm(&s, true, 3).output, Ok(Output::Alarms(vec![])));
    assert_eq!(s.alarms(), [nospace]);

    let refused: [(&str, Command); 4] = [
        ("put", cmd_put("b", "2")),
        ("lease grant", Command::LeaseGrant { id: 8, ttl: 60 }),
        (
            "txn with a put in its failure branch",
            Txn::new()
                .when(cmp("a", CompareResult::Equal, CompareTarget::Value(b("1"))))
                .then(op_get("a"))
                .otherwise(op_put("c", "3"))
                .cmd(),
        ),
        (
            "nested txn with a put",
            Txn::new()
                .then(Op::Txn(TxnRequest {
                    success: vec![op_put("d", "4")],
                    ..Default::default()
                }))
                .cmd(),
        ),
    ];
    for (what, cmd) in refused {
        assert!(cmd.takes_space(), "{what}");
        let applied = apply(&s, cmd);
        assert_eq!(applied.output, Err(MvccError::NoSpace), "{what}");
        assert_eq!(applied.revision, 1, "{what} changed the store");
    }

    // Reads, deletes, revokes and compaction free space and go through.
    let accepted: [(&str, Command); 4] = [
        ("read-only txn", Txn::new().then(op_get("a")).cmd()),
        (
            "delete",
            Txn::new().then(op_del(KeyRange::single("a"))).cmd(),
        ),
        ("lease revoke", Command::LeaseRevoke { id: 7 }),
        ("compaction", Command::Compact { revision: 2 }),
    ];
    for (what, cmd) in accepted {
        assert!(!cmd.takes_space(), "{what}");
        assert!(apply(&s, cmd).output.is_ok(), "{what}");
    }
    assert_eq!(get(&s, "a"), None);

    // Disarmed, writes are accepted again.
    assert_eq!(
        alarm(&s, false, 3).output,
        Ok(Output::Alarms(vec![nospace]))
    );
    assert!(s.alarms().is_empty());
    assert!(put(&s, "b", "2").output.is_ok());
}

/// A reader of `bytes` that stops at its first read until told to go on: a restore reading it
/// holds the key index meanwhile, as it does for the seconds a large snapshot takes.
struct Paused {
    bytes: std::io::Cursor<Vec<u8>>,
    reached: Option<std::sync::mpsc::Sender<()>>,
    go: std::sync::mpsc::Receiver<()>,
}

impl std::io::Read for Paused {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if let Some(reached) = self.reached.take() {
            let _ = reached.send(());
            let _ = self.go.recv();
        }
        self.bytes.read(buf)
    }
}

/// A member's status reads the alarms: they answer while a snapshot's restore holds the key
/// index (with what was committed before it), and are the snapshot's once it is restored.
#[test]
fn alarms_answer_during_a_restore_and_follow_it() {
    use std::sync::mpsc::channel;
    use std::time::Duration;
    let source = new_store();
    put(&source, "a", "1");
    alarm(&source, true, 3);
    let (bytes, _) = source.dump_encoded(&[]).expect("dump");
    let target = new_store();
    alarm(&target, true, 9);
    let nospace = |member| Alarm {
        member,
        kind: AlarmKind::NoSpace,
    };

    let (reached, at_read) = channel();
    let (go, paused) = channel();
    let restoring = {
        let target = target.clone();
        std::thread::spawn(move || {
            target.restore_from(&mut Paused {
                bytes: std::io::Cursor::new(bytes),
                reached: Some(reached),
                go: paused,
            })
        })
    };
    at_read
        .recv_timeout(Duration::from_secs(30))
        .expect("the restore began reading");
    let (tx, rx) = channel();
    {
        let target = target.clone();
        std::thread::spawn(move || {
            let _ = tx.send(target.alarms());
        });
    }
    let during = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("the alarms did not answer while a restore ran");
    assert_eq!(
        during,
        [nospace(9)],
        "not the alarms committed before the restore"
    );
    go.send(()).expect("go on");
    restoring.join().expect("restore thread").expect("restore");
    assert_eq!(target.alarms(), [nospace(3)]);
}
