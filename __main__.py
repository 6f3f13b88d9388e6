from branchgate.cli import main

raise SystemExit(main())
