from mpwatch.cli import main

raise SystemExit(main())
