from anisweep.cli import main

raise SystemExit(main())
