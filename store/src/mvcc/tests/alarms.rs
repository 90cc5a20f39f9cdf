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
    assert_eq!(s.alarms().expect("alarms"), [nospace]);

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
    assert!(s.alarms().expect("alarms").is_empty());
    assert!(put(&s, "b", "2").output.is_ok());
}
